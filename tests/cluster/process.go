package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one supervised component: its own process group (so a stop reaches
// anything it spawned, and a terminal's Ctrl-C reaches only the launcher, which
// then stops it in order), stdout+stderr appended to a log file, and SIGKILL
// from the kernel when the launcher dies without stopping it (parent-death signal).
type proc struct {
	name    string
	bin     string
	args    []string
	logPath string

	cmd     *exec.Cmd
	logFile *os.File
	start   uint64 // /proc/<pid>/stat starttime, guards against pid reuse
	done    chan struct{}
	mu      sync.Mutex
	waitErr error
}

func startProc(name, bin string, args, env []string, logPath string) (*proc, error) {
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(lf, "=== %s %s\n=== %s %s\n", time.Now().Format(time.RFC3339), name, bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	if len(env) > 0 {
		fmt.Fprintf(lf, "=== env %s\n", strings.Join(env, " "))
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout = lf
	cmd.Stderr = lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := spawn(cmd); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, bin: bin, args: args, logPath: logPath, cmd: cmd, logFile: lf, done: make(chan struct{})}
	p.start, _ = procStartTime(cmd.Process.Pid)
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		lf.Close()
		close(p.done)
	}()
	return p, nil
}

// The parent-death signal fires when the *thread* that forked the child exits,
// not the process (see prctl(2) PR_SET_PDEATHSIG). Go keeps its threads, except
// that a goroutine ending while locked to its thread (LockOSThread) takes the
// thread with it, which libraries sometimes do. So all forks happen on one
// goroutine that stays locked to its thread for the life of the process.
var (
	spawnOnce sync.Once
	spawnCh   = make(chan spawnReq)
)

type spawnReq struct {
	cmd *exec.Cmd
	err chan error
}

func spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		go func() {
			runtime.LockOSThread() // never unlocked: this thread lives as long as the process
			for r := range spawnCh {
				r.err <- r.cmd.Start()
			}
		}()
	})
	req := spawnReq{cmd: cmd, err: make(chan error, 1)}
	spawnCh <- req
	return <-req.err
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.waitErr == nil {
		return errors.New("exited with status 0")
	}
	return p.waitErr
}

// stop sends SIGTERM to the process group, then SIGKILL after grace, and waits.
func (p *proc) stop(grace time.Duration) {
	if p.exited() {
		killGroup(p.pid(), syscall.SIGKILL) // stragglers in its group, if any
		return
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
		<-p.done
	}
	killGroup(p.pid(), syscall.SIGKILL)
}

func killGroup(pgid int, sig syscall.Signal) { _ = syscall.Kill(-pgid, sig) }

// procStartTime reads field 22 (starttime, in clock ticks since boot) of /proc/<pid>/stat.
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("bad stat")
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); starttime is field 22.
	if len(f) < 20 {
		return 0, errors.New("short stat")
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// alive reports whether pid is running and is still the process recorded with
// the given start time (0 means unknown: trust the pid).
func alive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	st, err := procStartTime(pid)
	if err != nil {
		return false
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		if i := strings.LastIndexByte(string(b), ')'); i >= 0 {
			if f := strings.Fields(string(b)[i+1:]); len(f) > 0 && f[0] == "Z" {
				return false // zombie: dead, waiting for its parent
			}
		}
	}
	return start == 0 || st == start
}

// groupAlive reports whether any process is left in process group pgid.
func groupAlive(pgid int) bool {
	err := syscall.Kill(-pgid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// pidRecord is one line of the pidfile.
type pidRecord struct {
	Name  string `json:"name"`
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"`
	Bin   string `json:"bin,omitempty"`
}

// pidFile is DIR/run/pids.json: the launcher (supervisor) and every component,
// so that `down` can clean up after a launcher that crashed or was killed.
type pidFile struct {
	Supervisor pidRecord   `json:"supervisor"`
	Processes  []pidRecord `json:"processes"`
}

func pidFilePath(dir string) string { return filepath.Join(dir, "run", "pids.json") }

func readPidFile(dir string) (*pidFile, error) {
	b, err := os.ReadFile(pidFilePath(dir))
	if err != nil {
		return nil, err
	}
	var pf pidFile
	if err := json.Unmarshal(b, &pf); err != nil {
		return nil, fmt.Errorf("%s: %w", pidFilePath(dir), err)
	}
	return &pf, nil
}

func writeJSONAtomic(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Cleanup stops whatever a previous launcher left running in dir, using its
// pidfile: first the supervisor (which then stops its children in order), then
// any component still alive. Only processes whose pid and start time both match
// the record are signalled. It returns the names of the processes it killed.
func Cleanup(dir string, grace time.Duration) ([]string, error) {
	pf, err := readPidFile(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var killed []string
	sup := pf.Supervisor
	if sup.Pid != os.Getpid() && alive(sup.Pid, sup.Start) {
		_ = syscall.Kill(sup.Pid, syscall.SIGTERM)
		if waitGone(func() bool { return alive(sup.Pid, sup.Start) }, grace+10*time.Second) {
			killed = append(killed, "launcher")
		} else {
			_ = syscall.Kill(sup.Pid, syscall.SIGKILL)
			killed = append(killed, "launcher (SIGKILL)")
		}
	}
	// Reverse start order: clients before the API server, etcd last.
	for i := len(pf.Processes) - 1; i >= 0; i-- {
		r := pf.Processes[i]
		if !alive(r.Pid, r.Start) {
			continue
		}
		_ = syscall.Kill(-r.Pid, syscall.SIGTERM)
		if !waitGone(func() bool { return alive(r.Pid, r.Start) }, grace) {
			_ = syscall.Kill(-r.Pid, syscall.SIGKILL)
			waitGone(func() bool { return alive(r.Pid, r.Start) }, 5*time.Second)
		}
		killed = append(killed, r.Name)
	}
	for _, r := range pf.Processes {
		if alive(r.Pid, r.Start) {
			return killed, fmt.Errorf("%s (pid %d) is still running", r.Name, r.Pid)
		}
	}
	_ = os.Remove(pidFilePath(dir))
	return killed, nil
}

// Running reports whether a launcher or any component recorded in dir's pidfile
// is still alive.
func Running(dir string) bool {
	pf, err := readPidFile(dir)
	if err != nil {
		return false
	}
	if pf.Supervisor.Pid != os.Getpid() && alive(pf.Supervisor.Pid, pf.Supervisor.Start) {
		return true
	}
	for _, r := range pf.Processes {
		if alive(r.Pid, r.Start) {
			return true
		}
	}
	return false
}

func waitGone(isAlive func() bool, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if !isAlive() {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return !isAlive()
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
