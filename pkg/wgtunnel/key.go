package wgtunnel

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/contivbpf/contivbpf/pkg/atomicfile"
	"github.com/contivbpf/contivbpf/pkg/auth"
)

// KeyFile is the name of the host's private key file in the agent's state directory.
const KeyFile = "wireguard.key"

// LoadOrCreateKey returns the private key kept in dir/KeyFile, generating it (and dir,
// 0700) the first time. The file is written 0600 and atomically (a temporary file renamed
// into place), so a crash never leaves half a key. A key file that group or others may
// read is refused rather than used: that key must be taken as known to them. So is a key
// file another user owns or a symbolic link in its place, and a directory another user
// owns or group or others may write to (checkKeyDir).
func LoadOrCreateKey(dir string) (wgtypes.Key, error) {
	if err := checkKeyDir(dir); err != nil {
		return wgtypes.Key{}, err
	}
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

// checkKeyDir refuses a state directory that is not an absolute path (the key would land
// wherever the process happens to run), or that another user owns or may write to: whoever can
// put a file there can give the host a private key they know.
func checkKeyDir(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("wireguard key directory %q: want an absolute path (the agent's state directory)", dir)
	}
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // (made 0700 by writeKey)
	}
	if err != nil {
		return fmt.Errorf("wireguard key directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("wireguard key directory %s: not a directory", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || (st.Uid != 0 && int(st.Uid) != os.Geteuid()) {
		return fmt.Errorf("wireguard key directory %s: owned by another user, who can replace the key", dir)
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Errorf("wireguard key directory %s: mode %#o lets others replace the key; want 0700", dir, perm)
	}
	return nil
}

// readKey reads the key file itself (never through a symbolic link), which must be a
// regular file of ours that only we may read.
func readKey(path string) (wgtypes.Key, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, syscall.ELOOP) {
		return wgtypes.Key{}, fmt.Errorf("wireguard key file %s: a symbolic link, not the key: %w", path, err)
	}
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("wireguard key file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("wireguard key file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return wgtypes.Key{}, fmt.Errorf("wireguard key file %s: not a regular file", path)
	}
	if err := auth.CheckSecretFile("wireguard key file "+path, fi); err != nil {
		return wgtypes.Key{}, fmt.Errorf("%w (its key must be taken as known: remove the file for a new one)", err)
	}
	b, err := io.ReadAll(io.LimitReader(f, 128))
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
	if err := atomicfile.Write(filepath.Join(dir, KeyFile), []byte(k.String()+"\n"), 0o600); err != nil {
		return fmt.Errorf("wireguard key file: %w", err)
	}
	return nil
}
