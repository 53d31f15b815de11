package sim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// RepoRoot walks up from the working directory to the directory holding go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// Build compiles netmaster, netplugin and netctl from the repository at root into dir.
func Build(ctx context.Context, root, dir string) error {
	for _, b := range []string{"netmaster", "netplugin", "netctl"} {
		cmd := []string{"build", "-o", filepath.Join(dir, b), "./cmd/" + b}
		if out, err := runIn(ctx, root, "go", cmd...); err != nil {
			return fmt.Errorf("build %s: %w\n%s", b, err, out)
		}
	}
	return nil
}
