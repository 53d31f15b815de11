package netctl

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v2"
)

// monitorLine is one line of netplugin's /monitor stream.
type monitorLine struct {
	Time        time.Time `json:"time"`
	Host        string    `json:"host"`
	Reason      string    `json:"reason"`
	Proto       uint8     `json:"proto"`
	Src         string    `json:"src"`
	Dst         string    `json:"dst"`
	SrcPort     uint16    `json:"srcPort"`
	DstPort     uint16    `json:"dstPort"`
	EtherType   uint16    `json:"etherType"`
	Len         uint32    `json:"len"`
	SrcEndpoint string    `json:"srcEndpoint"`
	DstEndpoint string    `json:"dstEndpoint"`
	Network     string    `json:"network"`
	Rule        string    `json:"rule"`
	RuleEPG     uint16    `json:"ruleEPG"`
	RuleDir     string    `json:"ruleDir"`
	Lost        uint64    `json:"lost"`
}

// text is the human form: time, host, reason, both ends with names, protocol, rule.
func (l monitorLine) text() string {
	if l.Lost > 0 && l.Reason == "" {
		return fmt.Sprintf("%s %s: %d events lost (this reader was too slow)", time.Now().Format("15:04:05.000"), l.Host, l.Lost)
	}
	end := func(ip string, port uint16, name string) string {
		if ip == "" {
			return "?"
		}
		s := ip
		if port != 0 {
			s += ":" + fmt.Sprint(port)
		}
		if name != "" {
			s += " (" + name + ")"
		}
		return s
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s", l.Time.Local().Format("15:04:05.000"), l.Host, l.Reason)
	if l.Src != "" {
		fmt.Fprintf(&b, " %s > %s %s", end(l.Src, l.SrcPort, l.SrcEndpoint), end(l.Dst, l.DstPort, l.DstEndpoint), protoName(l.Proto))
	} else {
		fmt.Fprintf(&b, " ethertype %#04x", l.EtherType)
	}
	if l.RuleEPG != 0 {
		rule := l.Rule
		if rule == "" {
			rule = "(rule no longer installed)"
		}
		fmt.Fprintf(&b, " rule %s (group %d %s)", rule, l.RuleEPG, l.RuleDir)
		if l.Reason == "policy_allow" {
			b.WriteString(" new flow allowed")
		}
	}
	if l.Lost > 0 {
		fmt.Fprintf(&b, " [%d events lost before this one]", l.Lost)
	}
	return b.String()
}

func protoName(p uint8) string {
	switch p {
	case 1:
		return "icmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	}
	return fmt.Sprintf("proto %d", p)
}

// monitorCommand is `netctl monitor`: the dropped packets of one or more hosts as they
// happen, from their netplugins.
func monitorCommand() *cli.Command {
	return &cli.Command{
		Name: "monitor", Usage: "Stream dropped packets (with the rule that denied them) from hosts' netplugins", ArgsUsage: " ",
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: "agent", Aliases: []string{"host"}, Value: cli.NewStringSlice(DefaultAgent), EnvVars: []string{"CONTIV_AGENT"},
				Usage: "`URL` of a host's netplugin inspect API; repeat for several hosts"},
			&cli.StringFlag{Name: "endpoint", Aliases: []string{"e"}, Usage: "only packets from or to this endpoint (id substring or address)"},
			&cli.StringFlag{Name: "tenant", Usage: "only packets of this tenant's networks"},
			&cli.StringFlag{Name: "reason", Aliases: []string{"r"}, Usage: "only drops whose reason contains this (e.g. policy)"},
			&cli.BoolFlag{Name: "policy", Usage: "only policy verdicts"},
			&cli.BoolFlag{Name: "allowed", Usage: "also new flows a rule allowed (policy_allow, with the rule)"},
			&cli.IntFlag{Name: "count", Aliases: []string{"n"}, Usage: "stop after this many events (0: until interrupted)"},
			&cli.DurationFlag{Name: "duration", Usage: "stop after this long (0: until interrupted)"},
			jsonFlag(),
		},
		Action: runMonitor,
	}
}

func runMonitor(c *cli.Context) error {
	if c.NArg() != 0 {
		return usageErr(c, "%s", "More arguments than required")
	}
	q := url.Values{}
	for _, k := range []string{"endpoint", "tenant", "reason"} {
		if v := c.String(k); v != "" {
			q.Set(k, v)
		}
	}
	if c.Bool("policy") {
		q.Set("policy", "1")
	}
	if c.Bool("allowed") {
		q.Set("allowed", "1")
	}
	ctx := c.Context
	if d := c.Duration("duration"); d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	agents, err := agentBases(c, c.StringSlice("agent")...)
	if err != nil {
		return err
	}
	lines := make(chan monitorLine, 256)
	var wg sync.WaitGroup
	var mu sync.Mutex
	failed := 0
	for _, base := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := streamMonitor(ctx, base+"/monitor?"+q.Encode(), lines); err != nil && ctx.Err() == nil {
				fmt.Fprintf(c.App.ErrWriter, "%s: down: %v\n", base, err)
				mu.Lock()
				failed++
				mu.Unlock()
			}
		}()
	}
	go func() { wg.Wait(); close(lines) }()
	n, limit := 0, c.Int("count")
	for l := range lines {
		if c.Bool("json") {
			b, _ := json.Marshal(l)
			fmt.Fprintln(c.App.Writer, string(b))
		} else {
			fmt.Fprintln(c.App.Writer, l.text())
		}
		if l.Reason != "" {
			n++
		}
		if limit > 0 && n >= limit {
			stop()
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if failed == len(agents) {
		return &exitError{code: ExitAPI, msg: "no netplugin could be monitored"}
	}
	return nil
}

// streamMonitor copies one agent's stream into out until ctx ends or the stream does.
func streamMonitor(ctx context.Context, u string, out chan<- monitorLine) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	// No client timeout: the stream is open-ended; ctx ends it.
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l monitorLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("bad line %q: %w", sc.Text(), err)
		}
		select {
		case out <- l:
		case <-ctx.Done():
			return nil
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return fmt.Errorf("stream ended")
}
