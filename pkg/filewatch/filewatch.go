// Package filewatch reloads what a process read from files (token files, CA bundles,
// revocation lists) when those files change and on SIGHUP, so that a revocation takes
// effect without a restart.
package filewatch

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"
)

// Stamp tells a file's versions apart: its contents (mtime, size, inode) and its mode and
// status change time (a file refused for its mode and fixed with chmod is a new one). The
// zero Stamp is a missing file.
type Stamp struct {
	mod, ctime time.Time
	size       int64
	inode      uint64
	mode       os.FileMode
}

// StampOf is the stamp of a file with status st.
func StampOf(st os.FileInfo) Stamp {
	s := Stamp{mod: st.ModTime(), size: st.Size(), mode: st.Mode()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		s.inode = sys.Ino
		s.ctime = time.Unix(sys.Ctim.Sec, sys.Ctim.Nsec)
	}
	return s
}

// stampPath is the stamp of the file at path now (zero when it cannot be stat'ed).
func stampPath(path string) Stamp {
	st, err := os.Stat(path)
	if err != nil {
		return Stamp{}
	}
	return StampOf(st)
}

// ErrAgain, wrapped in the error of a Reload, says that it took what it could and held the
// rest back until a later reading agrees: Poll reads the files again at its next look
// though they did not change, and the log says so without calling it a failure.
var ErrAgain = errors.New("read again at the next look")

// Reloader names files and what reads them again.
type Reloader struct {
	// What names the files in the log ("token file", "--tls-client-ca/--tls-crl").
	What string
	// Paths are the files looked at; a change to any of them calls Reload.
	Paths []string
	// Reload reads the files again; its error is logged with Failed.
	Reload func() error
	// Failed says what a failed reload leaves in force ("no token works until it is
	// fixed", "the last good revocation list stays in force").
	Failed string
	Log    *slog.Logger
}

// Poll calls Reload whenever a file changed (looked at every `every`) until ctx ends. The
// first look always reloads (a change made before Poll started is not missed); a file
// refused once is not read again until it changes.
func (r Reloader) Poll(ctx context.Context, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	var last []Stamp // (nil: nothing seen yet)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := make([]Stamp, len(r.Paths))
		for i, p := range r.Paths {
			now[i] = stampPath(p)
		}
		if slices.Equal(now, last) {
			continue
		}
		first := last == nil
		last = now
		if err := r.reload(first, "changed"); errors.Is(err, ErrAgain) {
			last = []Stamp{} // (not nil: that is the first look)
		}
	}
}

// HoldSIGHUP takes SIGHUP for good, so that it never kills the process: call it first
// thing in main. SIGHUP asks Follow's reloaders to read their files again, but until one
// listens (after a slow start, or never when no such file is given) its default action
// would end the process. One arriving then is dropped: a reloader reads its files when it
// starts anyway.
func HoldSIGHUP() {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP)
}

// Follow is Poll plus a reload on every SIGHUP, until ctx ends.
func (r Reloader) Follow(ctx context.Context, every time.Duration) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go r.Poll(ctx, every)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			r.reload(false, "SIGHUP")
		}
	}
}

// reload calls Reload and logs the outcome (a quiet success on the first look).
func (r Reloader) reload(quiet bool, why string) error {
	err := r.Reload()
	switch {
	case errors.Is(err, ErrAgain):
		r.Log.Info(r.What+" reloaded in part", "why", why, "paths", r.Paths, "held", err)
	case err != nil:
		r.Log.Error(r.What+" cannot be taken: "+r.Failed, "why", why, "paths", r.Paths, "err", err)
	case !quiet:
		r.Log.Info(r.What+" reloaded", "why", why, "paths", r.Paths)
	}
	return err
}
