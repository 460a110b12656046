package cluster

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// RequireEnv, when set to 1, turns "tools not built" from a skip into a failure
// (for CI, so that a missing build cannot pass as green). The repository-wide
// TOPODRA_REQUIRE_TOOLS=1 (what `make test` sets) does the same.
const RequireEnv = "TOPODRA_E2E_REQUIRE"

// RequireTools reports whether missing tools must fail rather than skip.
func RequireTools() bool {
	return os.Getenv(RequireEnv) == "1" || os.Getenv("TOPODRA_REQUIRE_TOOLS") == "1"
}

// KeepEnv, when set to 1, keeps the cluster directory of passing tests too.
const KeepEnv = "TOPODRA_E2E_KEEP"

// StartT starts a cluster for a test:
//   - skips the test with instructions when the tool binaries are absent
//     (fails instead when TOPODRA_E2E_REQUIRE=1);
//   - uses a fresh directory under $TMPDIR unless opts.Dir is set;
//   - logs progress through t.Logf;
//   - registers a cleanup that stops every process, and on failure prints the
//     logs directory and each component's log tail (the directory is kept; it is
//     removed after a pass unless opts.Dir was given or TOPODRA_E2E_KEEP=1);
//   - stops the cluster on SIGINT/SIGTERM before the test binary exits (and
//     the kernel kills the components if the test binary dies anyway).
func StartT(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if _, err := FindTool(ToolsBin(opts.ToolsBin), APIServer); err != nil {
		if RequireTools() {
			t.Fatalf("%v (and tools are required: %s or TOPODRA_REQUIRE_TOOLS is 1)", err, RequireEnv)
		}
		t.Skipf("skipping: %v", err)
	}
	ownDir := opts.Dir == ""
	if ownDir {
		d, err := os.MkdirTemp("", "topodra-e2e-"+sanitize(t.Name())+"-")
		if err != nil {
			t.Fatal(err)
		}
		opts.Dir = d
	}
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	// A signal during the start cancels it (Start then stops what it began).
	ctx, cancel := context.WithCancel(context.Background())
	startDone := make(chan struct{})
	unregisterStart := onSignal(func() { cancel(); <-startDone })
	c, err := Start(ctx, opts)
	close(startDone)
	unregisterStart()
	cancel()
	if err != nil {
		t.Fatalf("start cluster (logs kept in %s/logs): %v", opts.Dir, err)
	}
	unregister := onSignal(func() { _ = c.Stop() })
	t.Cleanup(func() {
		unregister()
		if err := c.Stop(); err != nil {
			t.Errorf("stop cluster: %v", err)
		}
		if t.Failed() {
			t.Logf("cluster logs kept in %s", c.LogsDir)
			for _, n := range []string{Etcd, APIServer, ControllerManager, Scheduler} {
				if s := tail(c.LogFile(n), 15); s != "" {
					t.Logf("--- tail of %s:\n%s", c.LogFile(n), s)
				}
			}
			return
		}
		if ownDir && os.Getenv(KeepEnv) != "1" {
			_ = os.RemoveAll(c.Dir)
		}
	})
	return c
}

func sanitize(name string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '_'
	}, name)
}

var (
	sigMu      sync.Mutex
	sigHooks   = map[int]func(){}
	sigNext    int
	sigStarted bool
)

// onSignal runs hook when the process gets SIGINT or SIGTERM; after all hooks
// ran, the process exits with 130 or 143. It returns the undo. Without this,
// the test binary would die at once on a signal and the components would only
// be SIGKILLed by the kernel (parent-death signal), with no orderly stop.
func onSignal(hook func()) func() {
	sigMu.Lock()
	defer sigMu.Unlock()
	id := sigNext
	sigNext++
	sigHooks[id] = hook
	if !sigStarted {
		sigStarted = true
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
		go func() {
			sig := <-ch
			fmt.Fprintf(os.Stderr, "topodra cluster: %v: stopping clusters\n", sig)
			runHooks()
			code := 130
			if sig == syscall.SIGTERM {
				code = 143
			}
			os.Exit(code)
		}()
	}
	return func() {
		sigMu.Lock()
		delete(sigHooks, id)
		sigMu.Unlock()
	}
}

func runHooks() {
	sigMu.Lock()
	hooks := make([]func(), 0, len(sigHooks))
	for _, h := range sigHooks {
		hooks = append(hooks, h)
	}
	sigMu.Unlock()
	var wg sync.WaitGroup
	for _, h := range hooks {
		wg.Add(1)
		go func() { defer wg.Done(); h() }()
	}
	wg.Wait()
}
