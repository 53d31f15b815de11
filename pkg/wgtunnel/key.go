package wgtunnel

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// KeyFile is the name of the host's private key file in the agent's state directory.
const KeyFile = "wireguard.key"

// LoadOrCreateKey returns the private key kept in dir/KeyFile, generating it (and dir,
// 0700) the first time. The file is written 0600 and atomically (a temporary file renamed
// into place), so a crash never leaves half a key. A key file that group or others may
// read is refused rather than used: that key must be taken as known to them.
func LoadOrCreateKey(dir string) (wgtypes.Key, error) {
	path := filepath.Join(dir, KeyFile)
	k, err := readKey(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return k, err
	}
	k, err = wgtypes.GeneratePrivateKey()
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("generate wireguard private key: %w", err)
	}
	if err := writeKey(dir, k); err != nil {
		return wgtypes.Key{}, err
	}
	return k, nil
}

func readKey(path string) (wgtypes.Key, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("wireguard key file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return wgtypes.Key{}, fmt.Errorf("wireguard key file %s: not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return wgtypes.Key{}, fmt.Errorf("wireguard key file %s: mode %#o lets others read the private key; want 0600 (replace the key: remove the file)", path, perm)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("read wireguard key file: %w", err)
	}
	k, err := wgtypes.ParseKey(strings.TrimSpace(string(b)))
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("wireguard key file %s: %w", path, err)
	}
	return k, nil
}

// writeKey stores k as dir/KeyFile (mode 0600), replacing what was there.
func writeKey(dir string, k wgtypes.Key) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("wireguard key directory: %w", err)
	}
	f, err := os.CreateTemp(dir, KeyFile+".tmp-*")
	if err != nil {
		return fmt.Errorf("wireguard key file: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // (gone after the rename)
	// CreateTemp makes the file 0600; Chmod states it against a umask or an odd filesystem.
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("wireguard key file mode: %w", err)
	}
	if _, err := f.WriteString(k.String() + "\n"); err != nil {
		f.Close()
		return fmt.Errorf("write wireguard key file: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync wireguard key file: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close wireguard key file: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, KeyFile)); err != nil {
		return fmt.Errorf("install wireguard key file: %w", err)
	}
	return nil
}
