package cniapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"os"
	"time"

	"github.com/contivbpf/contivbpf/pkg/unixsock"
)

// Backend does the work behind the socket (the netplugin agent).
type Backend interface {
	AddPod(ctx context.Context, req PodRequest) (PodResponse, error)
	DelPod(ctx context.Context, req PodRequest) (PodResponse, error)
}

// Handler returns the HTTP handler for the protocol. Requests must be POST with
// Content-Type application/json (as Contiv's router requires).
func Handler(b Backend) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(PathAddPod, func(w http.ResponseWriter, r *http.Request) { serve(w, r, b.AddPod) })
	mux.HandleFunc(PathDelPod, func(w http.ResponseWriter, r *http.Request) { serve(w, r, b.DelPod) })
	return mux
}

func serve(w http.ResponseWriter, r *http.Request, fn func(context.Context, PodRequest) (PodResponse, error)) {
	if r.Method != http.MethodPost {
		http.Error(w, "method must be POST", http.StatusMethodNotAllowed)
		return
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		http.Error(w, "Content-Type must be application/json", http.StatusUnsupportedMediaType)
		return
	}
	var req PodRequest
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil {
		reply(w, http.StatusInternalServerError, PodResponse{Result: 1, ErrMsg: "decode request", ErrInfo: err.Error()})
		return
	}
	resp, err := fn(r.Context(), req)
	if err != nil {
		resp.Result = 1
		if resp.ErrMsg == "" {
			resp.ErrMsg = err.Error()
		}
		if resp.ErrInfo == "" {
			resp.ErrInfo = err.Error()
		}
		slog.Warn("cni request failed", "path", r.URL.Path, "pod", req.Name, "container", req.InfraContainerID, "err", err)
		reply(w, http.StatusInternalServerError, resp)
		return
	}
	reply(w, http.StatusOK, resp)
}

func reply(w http.ResponseWriter, code int, resp PodResponse) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(resp)
}

// Serve listens on the unix socket at path (see pkg/unixsock: mode 0600, or 0660 for
// group) and serves b until ctx ends; it removes the socket on return.
func Serve(ctx context.Context, path, group string, b Backend) error {
	if path == "" {
		path = DefaultSocket
	}
	l, err := unixsock.Listen(path, group)
	if err != nil {
		return fmt.Errorf("cni socket: %w", err)
	}
	defer os.Remove(path)
	srv := &http.Server{Handler: Handler(b), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	slog.Info("cni socket listening", "path", path)
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve cni socket %s: %w", path, err)
	}
	return nil
}
