// Package atomicfile replaces files so that a reader sees the old contents or the new,
// never half of them: the new contents go to a file of a fresh name beside the target
// (created exclusively, so a link planted there is never followed), synced, then renamed
// over it.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// Write replaces path with data, of mode perm. The directory must exist.
func Write(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // (gone after the rename)
	// CreateTemp makes the file 0600; Chmod states perm against a umask or an odd filesystem.
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return fmt.Errorf("replace %s: mode: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("replace %s: write: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("replace %s: sync: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("replace %s: close: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("replace %s: rename: %w", path, err)
	}
	return nil
}
