package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
)

// The plugin's identity in deploy/manifests (RBAC, admission policy, APF).
const (
	PluginNamespace      = "topodra-system"
	PluginServiceAccount = "topodra-kubelet-plugin"
)

// PluginIdentity gives a plugin process on node the identity it has in a real
// deployment: the ServiceAccount of deploy/manifests, with a token bound to a pod
// on that node (so the token carries the node name, which the ResourceSlice
// admission policy checks). It creates the pod object (bound to the node; the
// harness marks it Running, nothing runs it), requests the token with the admin
// client and writes a kubeconfig for it at path. The ServiceAccount must exist
// (apply deploy/manifests first).
func PluginIdentity(ctx context.Context, admin kubernetes.Interface, server string, caPEM []byte, node, path string, ttl time.Duration) error {
	name := "topodra-kubelet-plugin-" + node
	pods := admin.CoreV1().Pods(PluginNamespace)
	pod, err := pods.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		pod, err = pods.Create(ctx, &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
				"app.kubernetes.io/name": "topodra", "app.kubernetes.io/component": "kubelet-plugin"}},
			Spec: v1.PodSpec{
				NodeName:           node,
				ServiceAccountName: PluginServiceAccount,
				Tolerations:        []v1.Toleration{{Operator: v1.TolerationOpExists}},
				Containers: []v1.Container{{Name: "plugin", Image: "topodra-kubelet-plugin:e2e",
					Command: []string{"topodra-kubelet-plugin", "serve"}}},
			},
		}, metav1.CreateOptions{})
	}
	if err != nil {
		return fmt.Errorf("plugin pod %s/%s: %w", PluginNamespace, name, err)
	}
	tr, err := admin.CoreV1().ServiceAccounts(PluginNamespace).CreateToken(ctx, PluginServiceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To(int64(ttl / time.Second)),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token for %s/%s: %w", PluginNamespace, PluginServiceAccount, err)
	}
	return writeTokenKubeconfig(server, caPEM, tr.Status.Token, path)
}

// ControllerServiceAccount is the controller's ServiceAccount in deploy/manifests.
const ControllerServiceAccount = "topodra-controller"

// ControllerIdentity writes a kubeconfig at path with a token of the controller's
// ServiceAccount (deploy/manifests must be applied), so a controller process runs
// under the RBAC the chart gives it.
func ControllerIdentity(ctx context.Context, admin kubernetes.Interface, server string, caPEM []byte, path string, ttl time.Duration) error {
	return ServiceAccountKubeconfig(ctx, admin, server, caPEM, PluginNamespace, ControllerServiceAccount, path, ttl)
}

// ServiceAccountKubeconfig writes a kubeconfig at path with a token of the
// ServiceAccount namespace/name (which must exist), bound to no object: for
// processes whose RBAC the test sets up, such as another driver's plugin.
func ServiceAccountKubeconfig(ctx context.Context, admin kubernetes.Interface, server string, caPEM []byte, namespace, name, path string, ttl time.Duration) error {
	tr, err := admin.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(ttl / time.Second))},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token for %s/%s: %w", namespace, name, err)
	}
	return writeTokenKubeconfig(server, caPEM, tr.Status.Token, path)
}

func writeTokenKubeconfig(server string, caPEM []byte, token, path string) error {
	const cn = "topodra"
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[cn] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[cn] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts[cn] = &clientcmdapi.Context{Cluster: cn, AuthInfo: cn}
	cfg.CurrentContext = cn
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return clientcmd.WriteToFile(*cfg, path)
}
