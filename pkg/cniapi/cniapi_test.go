package cniapi

import (
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// recorder is a Backend that remembers the requests and fails pods named "bad".
type recorder struct{ got []PodRequest }

func (r *recorder) AddPod(_ context.Context, req PodRequest) (PodResponse, error) {
	r.got = append(r.got, req)
	if req.Name == "bad" {
		return PodResponse{}, errors.New("network missing")
	}
	return PodResponse{EndpointID: req.Network + "." + req.Tenant + "-" + req.InfraContainerID, IPAddress: "10.1.1.2/24"}, nil
}

func (r *recorder) DelPod(_ context.Context, req PodRequest) (PodResponse, error) {
	r.got = append(r.got, req)
	return PodResponse{}, nil
}

func TestServeRoundTrip(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "sub", "cni.sock")
	ctx, cancel := context.WithCancel(context.Background())
	b := &recorder{}
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, sock, "", b) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	c := NewClient(sock)
	deadline := time.Now().Add(5 * time.Second)
	var resp PodResponse
	var err error
	for {
		resp, err = c.AddPod(ctx, PodRequest{Name: "p1", InfraContainerID: "abc", Tenant: "t1", Network: "n1", NetNS: "/proc/1/ns/net", IfName: "eth0"})
		if err == nil || time.Now().After(deadline) || !strings.Contains(err.Error(), "connect") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("AddPod: %v", err)
	}
	if resp.EndpointID != "n1.t1-abc" || resp.IPAddress != "10.1.1.2/24" || resp.Result != 0 {
		t.Fatalf("AddPod reply = %+v", resp)
	}
	if len(b.got) != 1 || b.got[0].NetNS != "/proc/1/ns/net" || b.got[0].IfName != "eth0" {
		t.Fatalf("backend saw %+v", b.got)
	}
	resp, err = c.AddPod(ctx, PodRequest{Name: "bad"})
	if err == nil || resp.Result != 1 || resp.ErrMsg != "network missing" {
		t.Fatalf("failing AddPod: resp=%+v err=%v", resp, err)
	}
	if _, err := c.DelPod(ctx, PodRequest{Name: "p1"}); err != nil {
		t.Fatalf("DelPod: %v", err)
	}

	// Contiv's router only accepts JSON bodies.
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	r, err := hc.Post("http://x"+PathAddPod, "text/plain", strings.NewReader("{}"))
	if err != nil {
		t.Fatalf("post text/plain: %v", err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusUnsupportedMediaType {
		t.Fatalf("text/plain status = %d, want 415", r.StatusCode)
	}
	if len(b.got) != 3 {
		t.Fatalf("backend called %d times, want 3", len(b.got))
	}
}

func TestWithDefaults(t *testing.T) {
	r := PodRequest{}.WithDefaults()
	if r.Tenant != "default" || r.Network != "default-net" || r.IfName != "eth0" {
		t.Fatalf("defaults = %+v", r)
	}
}
