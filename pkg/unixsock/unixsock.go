// Package unixsock owns how netplugin's local unix sockets (CNI, Docker plugin) are
// created: a private directory, a stale socket replaced, and an explicit mode that does
// not depend on the process umask (0600, or 0660 for a configured group).
package unixsock

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
)

// Listen listens on the unix socket path. group, when not empty, is a group name or id
// that may also use the socket (mode 0660); otherwise the mode is 0600.
func Listen(path, group string) (net.Listener, error) {
	gid := -1
	if group != "" {
		g, err := lookupGroup(group)
		if err != nil {
			return nil, err
		}
		gid = g
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create socket dir of %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	mode := os.FileMode(0o600)
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			l.Close()
			return nil, fmt.Errorf("chown %s to group %s: %w", path, group, err)
		}
		mode = 0o660
	}
	if err := os.Chmod(path, mode); err != nil {
		l.Close()
		return nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	return l, nil
}

func lookupGroup(g string) (int, error) {
	if n, err := strconv.Atoi(g); err == nil && n >= 0 {
		return n, nil
	}
	grp, err := user.LookupGroup(g)
	if err != nil {
		return 0, fmt.Errorf("socket group %q: %w", g, err)
	}
	n, err := strconv.Atoi(grp.Gid)
	if err != nil {
		return 0, fmt.Errorf("socket group %q: gid %q", g, grp.Gid)
	}
	return n, nil
}
