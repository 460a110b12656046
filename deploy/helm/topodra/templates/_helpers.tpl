{{/*
Chart name, truncated to the 63 characters a label value allows.
*/}}
{{- define "topodra.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Prefix of object names: the release name, with the chart name appended unless the
release name already contains it ("topodra" renders as "topodra").
*/}}
{{- define "topodra.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Name of the kubelet plugin's objects (DaemonSet, cluster-scoped RBAC, policies).
*/}}
{{- define "topodra.kubeletPlugin.fullname" -}}
{{- printf "%s-kubelet-plugin" (include "topodra.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every object.
*/}}
{{- define "topodra.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "topodra.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: topodra
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Selector labels of the kubelet plugin pods. Immutable in a DaemonSet: never change.
*/}}
{{- define "topodra.kubeletPlugin.selectorLabels" -}}
app.kubernetes.io/name: {{ include "topodra.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: kubelet-plugin
{{- end }}

{{/*
All labels of the kubelet plugin's objects.
*/}}
{{- define "topodra.kubeletPlugin.labels" -}}
{{ include "topodra.labels" . }}
app.kubernetes.io/component: kubelet-plugin
{{- end }}

{{/*
The kubelet plugin's ServiceAccount name.
*/}}
{{- define "topodra.kubeletPlugin.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "topodra.kubeletPlugin.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The user name the API server sees for the plugin's ServiceAccount token.
*/}}
{{- define "topodra.kubeletPlugin.username" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "topodra.kubeletPlugin.serviceAccountName" .) }}
{{- end }}

{{/*
Name of the aligned DeviceClass: alignedClass.name, or the driver name with "-aligned"
after its first label (gpu.topodra.dev: gpu-aligned.topodra.dev).
*/}}
{{- define "topodra.alignedClassName" -}}
{{- if .Values.alignedClass.name }}
{{- .Values.alignedClass.name }}
{{- else }}
{{- $parts := splitn "." 2 .Values.driverName }}
{{- printf "%s-aligned.%s" $parts._0 $parts._1 }}
{{- end }}
{{- end }}

{{/*
Name of the MIG DeviceClass: the driver name with "mig" for its first label
(gpu.topodra.dev: mig.topodra.dev; gpu.nvidia.com: mig.nvidia.com, NVIDIA's own).
*/}}
{{- define "topodra.migClassName" -}}
{{- printf "mig.%s" (include "topodra.classDomain" .) }}
{{- end }}

{{/*
The driverName after its first label (topodra.dev for gpu.topodra.dev): the domain
the MIG classes are named under.
*/}}
{{- define "topodra.classDomain" -}}
{{- $parts := splitn "." 2 .Values.driverName }}
{{- $parts._1 }}
{{- end }}

{{/*
A MIG profile as the device plugin's mixed strategy spells it in a resource name:
"+" (media extensions, 1g.10gb+me) becomes ".", as in nvidia.com/mig-1g.10gb.me.
*/}}
{{- define "topodra.migResourceSuffix" -}}
{{- replace "+" "." . }}
{{- end }}

{{/*
The aligned MIG class: mig-aligned.<the driverName after its first label>, or
alignedClass.migName.
*/}}
{{- define "topodra.migAlignedClassName" -}}
{{- if .Values.alignedClass.migName }}
{{- .Values.alignedClass.migName }}
{{- else }}
{{- printf "mig-aligned.%s" (include "topodra.classDomain" .) }}
{{- end }}
{{- end }}

{{/*
The CPU class of the aligned pair: cpu-aligned.<the driverName after its first label>.
*/}}
{{- define "topodra.cpuAlignedClassName" -}}
{{- if .Values.cpuDriver.alignedClass.name }}
{{- .Values.cpuDriver.alignedClass.name }}
{{- else }}
{{- $parts := splitn "." 2 .Values.driverName }}
{{- printf "cpu-aligned.%s" $parts._1 }}
{{- end }}
{{- end }}

{{/*
An image reference from {registry, repository, tag, digest}: registry/repository:tag,
global.imageRegistry replacing the image's registry, no registry part when both are
empty, the tag defaulting to the chart's appVersion (the version `make image` tags),
with "@digest" appended when a digest is set. The runtime then pulls by the digest; the
tag stays for people reading the pod spec. Called with (list $ .Values.image).
*/}}
{{- define "topodra.imageRef" -}}
{{- $root := index . 0 }}
{{- $i := index . 1 }}
{{- $registry := default $i.registry ($root.Values.global).imageRegistry }}
{{- $name := $i.repository }}
{{- $parts := splitList "/" $i.repository }}
{{- if and $registry (gt (len $parts) 1) (or (contains "." (first $parts)) (eq (first $parts) "localhost")) }}
{{- fail (printf "repository %q starts with a registry host, and the registry %q would be put in front of it: set the registry to %q and the repository to %q (since chart 0.4 the two are separate values)" $i.repository $registry (first $parts) (join "/" (rest $parts))) }}
{{- end }}
{{- if $registry }}
{{- $name = printf "%s/%s" $registry $i.repository }}
{{- end }}
{{- $ref := printf "%s:%s" $name (default $root.Chart.AppVersion $i.tag) }}
{{- if $i.digest }}
{{- $ref = printf "%s@%s" $ref $i.digest }}
{{- end }}
{{- $ref }}
{{- end }}

{{/*
The kubelet plugin's image.
*/}}
{{- define "topodra.image" -}}
{{- include "topodra.imageRef" (list . .Values.image) }}
{{- end }}

{{/*
The pods' imagePullSecrets as a YAML list: global.imagePullSecrets, then
imagePullSecrets, each secret once; nothing when there are none.
*/}}
{{- define "topodra.imagePullSecrets" -}}
{{- $all := concat (default list (.Values.global).imagePullSecrets) .Values.imagePullSecrets | uniq }}
{{- with $all }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/*
A host path joined with a relative path, without doubled slashes ("/" + "dev" is "/dev").
*/}}
{{- define "topodra.hostJoin" -}}
{{- $base := index . 0 | trimSuffix "/" }}
{{- printf "%s/%s" $base (index . 1) }}
{{- end }}

{{/*
LD_LIBRARY_PATH through which the plugin finds libnvidia-ml.so.1 in the driver root.
*/}}
{{- define "topodra.kubeletPlugin.ldLibraryPath" -}}
{{- if .Values.kubeletPlugin.ldLibraryPath }}
{{- .Values.kubeletPlugin.ldLibraryPath }}
{{- else }}
{{- $dirs := list "usr/lib64" "usr/lib/x86_64-linux-gnu" "usr/lib/aarch64-linux-gnu" "lib64" "lib/x86_64-linux-gnu" "lib/aarch64-linux-gnu" "usr/lib" }}
{{- $out := list }}
{{- range $dirs }}
{{- $out = append $out (printf "/driver-root/%s" .) }}
{{- end }}
{{- join ":" $out }}
{{- end }}
{{- end }}

{{/*
The kubelet plugin's node selection while kubeletPlugin.nodeSelector and affinity are
both empty: a node with any one of the labels that mark NVIDIA GPU nodes, as NVIDIA's
device plugin and GPU operator charts select them. Terms of a required nodeAffinity
are ORed; labels in one nodeSelector would be ANDed, and a cluster labelled by NFD
alone, or by the GPU operator alone, would get no plugin pod.
*/}}
{{- define "topodra.kubeletPlugin.defaultAffinity" -}}
# Any of the GPU node labels: NFD's NVIDIA PCI vendor (10de), NFD's CPU vendor on
# Tegra systems (integrated GPU, no PCI device), or GPU feature discovery's / the GPU
# operator's nvidia.com/gpu.present (also the label to set by hand).
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
        - matchExpressions:
            - key: feature.node.kubernetes.io/pci-10de.present
              operator: In
              values: ["true"]
        - matchExpressions:
            - key: feature.node.kubernetes.io/cpu-model.vendor_id
              operator: In
              values: ["NVIDIA"]
        - matchExpressions:
            - key: nvidia.com/gpu.present
              operator: In
              values: ["true"]
{{- end }}

{{/*
Checks of values that would otherwise fail at run time on every node.
*/}}
{{- define "topodra.validate" -}}
{{- if not (has .Values.kubeletPlugin.numaNodeFormat (list "int" "list")) }}
{{- fail (printf "kubeletPlugin.numaNodeFormat must be \"int\" or \"list\", not %q" .Values.kubeletPlugin.numaNodeFormat) }}
{{- end }}
{{- if not (has .Values.kubeletPlugin.attributes (list "lean" "full")) }}
{{- fail (printf "kubeletPlugin.attributes must be \"lean\" or \"full\", not %q" .Values.kubeletPlugin.attributes) }}
{{- end }}
{{- range .Values.kubeletPlugin.numaNodeAliases }}
{{- if or (hasPrefix "resource.kubernetes.io/" .) (hasPrefix (printf "%s/" $.Values.driverName) .) }}
{{- fail (printf "kubeletPlugin.numaNodeAliases: %q is in resource.kubernetes.io or this driver's own domain; an alias is another driver's name, such as dra.net/numaNode" .) }}
{{- end }}
{{- end }}
{{- if not (has .Values.kubeletPlugin.logFormat (list "json" "text")) }}
{{- fail (printf "kubeletPlugin.logFormat must be \"json\" or \"text\", not %q" .Values.kubeletPlugin.logFormat) }}
{{- end }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$" .Values.driverName) }}
{{- fail (printf "driverName must be a DNS subdomain with at least one dot (like gpu.topodra.dev), not %q" .Values.driverName) }}
{{- end }}
{{- if and .Values.kubeletPlugin.enableMigMode (not .Values.kubeletPlugin.dynamicMig) }}
{{- fail "kubeletPlugin.enableMigMode needs kubeletPlugin.dynamicMig: MIG mode is turned on for dynamic MIG's partitions" }}
{{- end }}
{{- range .Values.deviceClass.migExtendedResources }}
{{- if not (regexMatch "^[0-9]+g\\.[0-9]+gb(\\+[a-z]+)*$" (toString .)) }}
{{- fail (printf "deviceClass.migExtendedResources: %q is not a MIG profile name as nvidia-smi mig -lgip prints it (1g.10gb, 3g.40gb, 1g.10gb+me)" (toString .)) }}
{{- end }}
{{- end }}
{{- if .Values.alignedClass.enabled }}
{{- $aligned := include "topodra.alignedClassName" . }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)+$" $aligned) }}
{{- fail (printf "the aligned DeviceClass name must be a DNS subdomain of labels of at most 63 characters, not %q (set alignedClass.name)" $aligned) }}
{{- end }}
{{- if eq $aligned .Values.driverName }}
{{- fail "alignedClass.name must differ from driverName, the default class" }}
{{- end }}
{{- $migAligned := include "topodra.migAlignedClassName" . }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)+$" $migAligned) }}
{{- fail (printf "the aligned MIG DeviceClass name must be a DNS subdomain of labels of at most 63 characters, not %q (set alignedClass.migName)" $migAligned) }}
{{- end }}
{{- if has $migAligned (list $aligned .Values.driverName (include "topodra.migClassName" .)) }}
{{- fail "alignedClass.migName must differ from the other classes' names" }}
{{- end }}
{{- if semverCompare "<1.36.0-0" .Capabilities.KubeVersion.Version }}
{{- fail "alignedClass.enabled needs Kubernetes 1.36 or later (MutatingAdmissionPolicy v1); set it to false on older clusters" }}
{{- end }}
{{- end }}
{{- with .Values.cpuDriver.alignedClass }}
{{- if .enabled }}
{{- if not $.Values.alignedClass.enabled }}
{{- fail "cpuDriver.alignedClass.enabled needs alignedClass.enabled: the GPU class's policy aligns both" }}
{{- end }}
{{- if not $.Values.cpuDriver.name }}
{{- fail "cpuDriver.alignedClass.enabled needs cpuDriver.name" }}
{{- end }}
{{- if and (ne .numaAttribute "resource.kubernetes.io/numaNode") (not (has .numaAttribute $.Values.kubeletPlugin.numaNodeAliases)) }}
{{- fail (printf "cpuDriver.alignedClass.numaAttribute %q is not published by the GPU plugin: add it to kubeletPlugin.numaNodeAliases" .numaAttribute) }}
{{- end }}
{{- if eq (include "topodra.cpuAlignedClassName" $) (include "topodra.alignedClassName" $) }}
{{- fail "cpuDriver.alignedClass.name must differ from alignedClass.name" }}
{{- end }}
{{- end }}
{{- end }}
{{- if not (hasPrefix "/" (toString .Values.kubeletPlugin.driverRoot)) }}
{{- fail "kubeletPlugin.driverRoot must be an absolute host path" }}
{{- end }}
{{- /* The schema says the same; these also hold with --skip-schema-validation. */}}
{{- if not (regexMatch "^(/|(/[^/]+)+)$" (toString .Values.kubeletPlugin.driverRoot)) }}
{{- fail (printf "kubeletPlugin.driverRoot must be \"/\" or an absolute path without a trailing or doubled slash (the CDI specs name host paths under it), not %q" (toString .Values.kubeletPlugin.driverRoot)) }}
{{- end }}
{{- with (default dict .Values.kubeletPlugin.cdiHook).hostPath }}
{{- if not (regexMatch "^(/[^/]+)+$" (toString .)) }}
{{- fail (printf "kubeletPlugin.cdiHook.hostPath must be an absolute path of a file on the host, without a trailing or doubled slash (e.g. /usr/bin/nvidia-cdi-hook), not %q" (toString .)) }}
{{- end }}
{{- end }}
{{- range $key, $port := dict "kubeletPlugin.httpPort" .Values.kubeletPlugin.httpPort "controller.httpPort" .Values.controller.httpPort }}
{{- if or (lt (int64 $port) 1) (gt (int64 $port) 65535) (ne (float64 $port) (float64 (int64 $port))) }}
{{- fail (printf "%s must be a port number from 1 to 65535, not %v" $key $port) }}
{{- end }}
{{- end }}
{{- $c := .Values.controller }}
{{- if and $c.enabled (gt (int64 $c.replicas) 1) (not $c.leaderElection.enabled) }}
{{- fail (printf "controller.replicas is %v with controller.leaderElection.enabled false: every replica would write NodeResourceTopology objects and Events; enable leader election or run one replica" $c.replicas) }}
{{- end }}
{{- range $key := list "httpHeaderReadTimeoutSeconds" "httpMaxConnections" "httpWriteTimeoutSeconds" "httpMaxRequestsPerConnection" "maxConcurrentClaimsPerCall" "maxConcurrentClaims" }}
{{- $v := index $.Values.kubeletPlugin $key }}
{{- if or (lt (int64 $v) 1) (ne (float64 $v) (float64 (int64 $v))) }}
{{- fail (printf "kubeletPlugin.%s must be a whole number of at least 1, not %v" $key $v) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Name of the controller's objects.
*/}}
{{- define "topodra.controller.fullname" -}}
{{- printf "%s-controller" (include "topodra.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels of the controller pods. Immutable in a Deployment: never change.
*/}}
{{- define "topodra.controller.selectorLabels" -}}
app.kubernetes.io/name: {{ include "topodra.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{/*
All labels of the controller's objects.
*/}}
{{- define "topodra.controller.labels" -}}
{{ include "topodra.labels" . }}
app.kubernetes.io/component: controller
{{- end }}

{{/*
The controller's ServiceAccount name.
*/}}
{{- define "topodra.controller.serviceAccountName" -}}
{{- if .Values.controller.serviceAccount.create }}
{{- default (include "topodra.controller.fullname" .) .Values.controller.serviceAccount.name }}
{{- else }}
{{- required "controller.serviceAccount.name is required when controller.serviceAccount.create is false" .Values.controller.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The controller's image.
*/}}
{{- define "topodra.controller.image" -}}
{{- include "topodra.imageRef" (list . .Values.controller.image) }}
{{- end }}
