package cluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ToolsEnv names the environment variable that points at the built tools: a
// PATH-like list of directories, as printed by `tests/tools/build.sh --print-path`
// (or exported by `eval "$(tests/tools/build.sh --env)"`).
const ToolsEnv = "TOPODRA_TOOLS_BIN"

// ErrToolsMissing is returned (wrapped) by Start and FindTool when a binary is
// not found; tests skip on it (see StartT).
var ErrToolsMissing = errors.New("tool binaries not found")

// ToolsBin returns the tool search path: explicit if non-empty, else $TOPODRA_TOOLS_BIN.
func ToolsBin(explicit string) string {
	if explicit != "" {
		return explicit
	}
	return os.Getenv(ToolsEnv)
}

// FindTool looks name up in the colon-separated list of directories bin (see
// ToolsBin). It never falls back to $PATH: a stray kube-apiserver of another
// version must not be picked up silently.
func FindTool(bin, name string) (string, error) {
	if bin == "" {
		return "", fmt.Errorf("%w: %s is not set; run: eval \"$(tests/tools/build.sh --env)\"", ErrToolsMissing, ToolsEnv)
	}
	for _, dir := range filepath.SplitList(bin) {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: %s not in %s=%s; run tests/tools/build.sh", ErrToolsMissing, name, ToolsEnv, bin)
}

// toolVersion runs `<bin> --version` and
// returns its first line, for the logs.
func toolVersion(path string) string {
	out, err := exec.Command(path, "--version").CombinedOutput()
	if err != nil {
		return "unknown"
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}
