package e2e

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// Every shell block of the user and operator docs says how it is kept true: a test
// runs its very text, tests check what it does, or it is only an illustration (and
// says why). The marker is an HTML comment on the line right above the opening
// fence, so it does not show when the page is rendered:
//
//	<!-- docs-check: run TestDeploymentGuide install -->
//	<!-- docs-check: checked-by TestChartImageReferences make:image-check -->
//	<!-- docs-check: illustrative: needs a real GPU node -->
//
// run: the named test executes the block (with the substitutions it lists), under
// the step id that follows; checked-by: each name is a Go test function, a Rust test
// function or `make:<target>`, and covers what the commands do, not their literal
// text; illustrative: nothing runs it, and the reason says why.

// docsChecked are the pages whose shell blocks must carry a marker.
func docsChecked(t testing.TB) []string {
	t.Helper()
	root := repoRoot(t)
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(root, "README.md"))
	sort.Strings(pages)
	rel := make([]string, 0, len(pages))
	for _, p := range pages {
		r, err := filepath.Rel(root, p)
		if err != nil {
			t.Fatal(err)
		}
		rel = append(rel, r)
	}
	return rel
}

// docBlock is one fenced block of a page.
type docBlock struct {
	page string
	line int    // of the opening fence, 1-based
	lang string // the fence's info string
	text string // the lines between the fences, with the fence's indentation removed

	kind   string   // run, checked-by or illustrative; "" without a marker
	names  []string // run: the test and the step id; checked-by: the names
	reason string   // illustrative
	badTag string   // a docs-check comment that does not parse
}

// isShell: a block of commands a reader would type.
func (b docBlock) isShell() bool {
	switch b.lang {
	case "sh", "bash", "shell", "console":
		return true
	case "":
		return strings.HasPrefix(strings.TrimSpace(b.text), "$ ")
	}
	return false
}

var (
	fenceRe  = regexp.MustCompile("^( *)(```+)([A-Za-z0-9_+-]*)\\s*$")
	markerRe = regexp.MustCompile(`^\s*<!--\s*docs-check:\s*(.*?)\s*-->\s*$`)
)

// parseDocBlocks reads the fenced blocks of one page (relative to the repository).
func parseDocBlocks(t testing.TB, page string) []docBlock {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot(t), page))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		blocks   []docBlock
		cur      *docBlock
		indent   int
		fence    string
		body     []string
		previous string
		n        int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := sc.Text()
		m := fenceRe.FindStringSubmatch(line)
		switch {
		case cur == nil && m != nil:
			cur = &docBlock{page: page, line: n, lang: m[3]}
			indent, fence, body = len(m[1]), m[2], nil
			parseMarker(cur, previous)
		case cur != nil && m != nil && m[2] == fence && m[3] == "":
			cur.text = strings.Join(body, "\n")
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			body = append(body, strings.TrimPrefix(line, strings.Repeat(" ", indent)))
		}
		previous = line
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("%s:%d: a fenced block that never closes", page, cur.line)
	}
	return blocks
}

func parseMarker(b *docBlock, line string) {
	m := markerRe.FindStringSubmatch(line)
	if m == nil {
		return
	}
	kind, rest, _ := strings.Cut(m[1], " ")
	rest = strings.TrimSpace(rest)
	switch kind {
	case "run":
		b.names = strings.Fields(rest)
		if len(b.names) != 2 {
			b.badTag = "run needs a test and a step id: " + m[1]
			return
		}
	case "checked-by":
		b.names = strings.Fields(rest)
		if len(b.names) == 0 {
			b.badTag = "checked-by names no test: " + m[1]
			return
		}
	case "illustrative:":
		kind = "illustrative"
		b.reason = rest
		if rest == "" {
			b.badTag = "illustrative without a reason"
			return
		}
	default:
		b.badTag = "unknown docs-check kind: " + m[1]
		return
	}
	b.kind = kind
}

// testNames are the test functions of the repository: Go tests under tests/ and
// deploy/, Rust functions (the Rust side names tests by function), and make targets
// as make:<target>. A checked-by that names none of them is stale.
func testNames(t testing.TB) map[string]bool {
	t.Helper()
	root := repoRoot(t)
	names := map[string]bool{}
	goTest := regexp.MustCompile(`(?m)^func (Test\w+)\(`)
	rustFn := regexp.MustCompile(`(?m)^\s*(?:pub(?:\([a-z]+\))? )?(?:async )?fn (\w+)\(`)
	walk := func(dir string) {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "target" || d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			var re *regexp.Regexp
			switch {
			case strings.HasSuffix(p, "_test.go"):
				re = goTest
			case strings.HasSuffix(p, ".rs"):
				re = rustFn
			default:
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, m := range re.FindAllStringSubmatch(string(b), -1) {
				names[m[1]] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"tests", "deploy", "kubelet-plugin", "controller", "driver", "proto"} {
		walk(d)
	}
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^([a-z][a-z0-9-]*):`).FindAllStringSubmatch(string(mk), -1) {
		names["make:"+m[1]] = true
	}
	return names
}

// TestDocsShellBlocksAreCheckedOrIllustrative holds the docs to their commands:
// every shell block of docs/ and the README carries a docs-check marker, each name a
// marker gives exists, and a test that runs blocks names the page it reads.
func TestDocsShellBlocksAreCheckedOrIllustrative(t *testing.T) {
	t.Parallel()
	names := testNames(t)
	sources := map[string]string{} // test name -> the source of its file
	root := repoRoot(t)
	goFiles, _ := filepath.Glob(filepath.Join(root, "tests", "e2e", "*_test.go"))
	for _, f := range goFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`(?m)^func (Test\w+)\(`).FindAllStringSubmatch(string(b), -1) {
			sources[m[1]] = string(b)
		}
	}
	counts := map[string]int{}
	steps := map[string]string{} // page + test + step -> where it was first seen
	for _, page := range docsChecked(t) {
		for _, b := range parseDocBlocks(t, page) {
			where := fmt.Sprintf("%s:%d", b.page, b.line)
			if b.badTag != "" {
				t.Errorf("%s: %s", where, b.badTag)
				continue
			}
			if !b.isShell() {
				if b.kind != "" {
					t.Errorf("%s: a docs-check marker on a %q block, which holds no commands", where, b.lang)
				}
				continue
			}
			counts[b.kind]++
			switch b.kind {
			case "":
				t.Errorf("%s: a shell block without a docs-check marker (run, checked-by or illustrative) on the line above", where)
			case "run":
				test, step := b.names[0], b.names[1]
				src, ok := sources[test]
				if !ok {
					t.Errorf("%s: run %s: no such test in tests/e2e", where, test)
					continue
				}
				if !strings.Contains(src, `"`+filepath.ToSlash(page)+`"`) {
					t.Errorf("%s: run %s: that test's file never names %q", where, test, page)
				}
				key := page + " " + test + " " + step
				if first, dup := steps[key]; dup {
					t.Errorf("%s: step %s of %s again (first at %s)", where, step, test, first)
				}
				steps[key] = where
			case "checked-by":
				for _, n := range b.names {
					if !names[n] {
						t.Errorf("%s: checked-by %s: no Go test, Rust function or make target of that name", where, n)
					}
				}
			}
		}
	}
	t.Logf("shell blocks: %d run, %d checked by tests, %d illustrative", counts["run"], counts["checked-by"], counts["illustrative"])
}

// docSteps are the blocks of page that test runs, by step id.
func docSteps(t testing.TB, page, test string) map[string]docBlock {
	t.Helper()
	steps := map[string]docBlock{}
	for _, b := range parseDocBlocks(t, page) {
		if b.kind == "run" && b.names[0] == test {
			steps[b.names[1]] = b
		}
	}
	return steps
}

// TestParseDocBlocks: fences, indentation, markers and what counts as commands.
func TestParseDocBlocks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	page := filepath.Join(dir, "page.md")
	const text = "intro\n" +
		"<!-- docs-check: run TestX one -->\n" +
		"```sh\nmake image\n```\n" +
		"- item\n" +
		"  <!-- docs-check: illustrative: needs a GPU -->\n" +
		"  ```console\n  $ nvidia-smi\n  ```\n" +
		"```yaml\na: 1\n```\n" +
		"```\n$ kubectl get nodes\n```\n" +
		"<!-- docs-check: sometimes -->\n" +
		"```sh\nls\n```\n"
	if err := os.WriteFile(page, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(repoRoot(t), page)
	if err != nil {
		t.Fatal(err)
	}
	b := parseDocBlocks(t, rel)
	if len(b) != 5 {
		t.Fatalf("%d blocks, want 5: %+v", len(b), b)
	}
	if b[0].kind != "run" || b[0].names[1] != "one" || b[0].text != "make image" || !b[0].isShell() {
		t.Errorf("block 1: %+v", b[0])
	}
	if b[1].kind != "illustrative" || b[1].reason != "needs a GPU" || b[1].text != "$ nvidia-smi" || b[1].line != 8 {
		t.Errorf("block 2: %+v", b[1])
	}
	if b[2].isShell() || b[2].kind != "" {
		t.Errorf("block 3 (yaml): %+v", b[2])
	}
	if !b[3].isShell() || b[3].kind != "" {
		t.Errorf("block 4 (untagged, a prompt): %+v", b[3])
	}
	if b[4].badTag == "" {
		t.Errorf("block 5: an unknown kind must not parse: %+v", b[4])
	}
}
