package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"time"
)

// metricsClient is the admin user's client certificate without server
// verification: kube-scheduler and kube-controller-manager serve /metrics on a
// self-signed certificate they make at start, which no CA here signed. The
// admin user (system:masters) passes their delegated authorization.
func metricsClient(certFile, keyFile string) (*http.Client, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true}, //nolint:gosec // loopback, self-signed component certs
	}}, nil
}

// setMetricsURL records where a component serves /metrics once it is ready.
func (c *Cluster) setMetricsURL(component, url string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.metricsURLs == nil {
		c.metricsURLs = map[string]string{}
	}
	c.metricsURLs[component] = url
}

// MetricsURL is the /metrics URL of a component (APIServer, ControllerManager,
// Scheduler, Kwok), "" when it does not run.
func (c *Cluster) MetricsURL(component string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.metricsURLs[component]
}

// Scrape fetches a Prometheus text page as the admin user: a component's
// MetricsURL, or the /metrics of a process the caller started beside the
// cluster with the cluster's kubeconfig for its delegated authentication.
func (c *Cluster) Scrape(ctx context.Context, url string) ([]byte, error) {
	if c.metrics == nil {
		return nil, fmt.Errorf("cluster not started")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	// Named, so that an audit log tells the scrapes from the workload.
	req.Header.Set("User-Agent", "metrics-scraper")
	resp, err := c.metrics.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %.200s", url, resp.Status, body)
	}
	return body, nil
}
