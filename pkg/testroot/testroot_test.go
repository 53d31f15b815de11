package testroot

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOneRootRule: no test outside this package decides by itself whether it runs as
// root (a bare os.Geteuid check skips, fails or prepares differently from Need and Have,
// and says so in its own words, if at all).
func TestOneRootRule(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", "..")) // (a test runs in its package's directory)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the module's root: %v", err)
	}
	var bare []string
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "vendor" || d.Name() == "testdata"):
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(p, "_test.go") || filepath.Dir(p) == filepath.Join(root, "pkg", "testroot"):
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), "os.Geteuid()") {
			rel, _ := filepath.Rel(root, p)
			bare = append(bare, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(bare) > 0 {
		t.Errorf("tests checking for root themselves (use testroot.Need, or testroot.Have in a TestMain): %v", bare)
	}
}
