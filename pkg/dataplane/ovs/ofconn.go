package ovs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	of "github.com/contiv/libOpenflow/openflow13"
)

// OpenFlow 1.3 message types used here.
const (
	ofptHello          = 0
	ofptError          = 1
	ofptEchoRequest    = 2
	ofptEchoReply      = 3
	ofptExperimenter   = 4
	ofptMultipartReq   = 18
	ofptMultipartReply = 19
	ofptBarrierRequest = 20
	ofptBarrierReply   = 21
	ofptPacketIn       = 10
	ofptSetConfig      = 9
	ofpcFragNXMatch    = 3 // OFPC_FRAG_NX_MATCH in ofp_switch_config.flags
	ofptSetAsync       = 28
	ofptMeterMod       = 29
	ofVersion13        = 4
)

// rawMsg carries an already marshalled OpenFlow message (e.g. inside a bundle add).
type rawMsg []byte

func (r rawMsg) Len() uint16                     { return uint16(len(r)) }
func (r rawMsg) MarshalBinary() ([]byte, error)  { return []byte(r), nil }
func (r *rawMsg) UnmarshalBinary(b []byte) error { *r = append((*r)[:0], b...); return nil }

type marshaler interface{ MarshalBinary() ([]byte, error) }

// ofError is an OpenFlow error message answered by the switch.
type ofError struct {
	Type, Code uint16
	ExpType    uint16
}

func (e *ofError) Error() string {
	if e.Type == 0xffff {
		return fmt.Sprintf("openflow experimenter error %d", e.ExpType)
	}
	return fmt.Sprintf("openflow error type %d code %d", e.Type, e.Code)
}

type reply struct {
	msgs [][]byte // bodies (after the 8-byte header) of the reply and its multipart continuations
	err  error
}

// ofConn is a small synchronous OpenFlow 1.3 connection to one bridge's management
// socket: requests are matched to replies by xid, echo requests are answered, and the
// connection reports its loss on Done.
type ofConn struct {
	conn    net.Conn
	wmu     sync.Mutex
	xid     atomic.Uint32
	mu      sync.Mutex
	pending map[uint32]chan reply
	partial map[uint32][][]byte
	done    chan struct{}
	err     error
	// packetIn gets the body of every packet-in (read loop; must not block).
	packetIn func(body []byte)
}

// dialOF connects to a bridge's management socket; packetIn (may be nil) gets the
// packets flows send to the controller, which the connection asks OVS for.
func dialOF(ctx context.Context, path string, packetIn func(body []byte)) (*ofConn, error) {
	d := net.Dialer{}
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("openflow dial %s: %w", path, err)
	}
	c := &ofConn{conn: conn, pending: map[uint32]chan reply{}, partial: map[uint32][][]byte{}, done: make(chan struct{}), packetIn: packetIn}
	// Hello with a version bitmap offering only OpenFlow 1.3.
	hello := []byte{ofVersion13, ofptHello, 0, 16, 0, 0, 0, 1, 0, 1, 0, 8, 0, 0, 0, 1 << ofVersion13}
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write(hello); err != nil {
		conn.Close()
		return nil, fmt.Errorf("openflow hello: %w", err)
	}
	typ, _, _, err := readMsg(conn)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("openflow hello reply: %w", err)
	}
	if typ != ofptHello {
		conn.Close()
		return nil, fmt.Errorf("openflow hello reply: got message type %d", typ)
	}
	_ = conn.SetDeadline(time.Time{})
	c.xid.Store(100)
	go c.readLoop()
	// The bridge's fragment handling is Nicira's nx-match: a first fragment keeps its L4
	// ports for the flow tables (OpenFlow's "normal" zeroes them in every fragment, and
	// a port rule could then never allow a fragmented datagram); later ones have none.
	// A management (service) connection gets no asynchronous messages unless it sets a
	// miss_send_len; then packet-ins from output:CONTROLLER (reason OFPR_ACTION) only.
	cfg := []byte{0, ofpcFragNXMatch, 0, 0} // flags, miss_send_len
	msgs := [][]byte{c.newMsg(ofptSetConfig, cfg)}
	if packetIn != nil {
		cfg[3] = monitorMaxLen
		async := make([]byte, 24) // packet_in, port_status, flow_removed masks (master, slave)
		binary.BigEndian.PutUint32(async[0:], 1<<ofprAction)
		binary.BigEndian.PutUint32(async[4:], 1<<ofprAction)
		msgs = append(msgs, c.newMsg(ofptSetAsync, async))
	}
	for _, m := range msgs {
		if err := c.write(m); err != nil {
			c.Close()
			return nil, fmt.Errorf("openflow switch config: %w", err)
		}
	}
	// Make sure the switch accepted the version before returning.
	if _, err := c.call(ctx, c.newMsg(ofptBarrierRequest, nil)); err != nil {
		c.Close()
		return nil, fmt.Errorf("openflow barrier after hello: %w", err)
	}
	return c, nil
}

func readMsg(r io.Reader) (typ uint8, xid uint32, body []byte, err error) {
	var h [8]byte
	if _, err = io.ReadFull(r, h[:]); err != nil {
		return 0, 0, nil, err
	}
	n := int(binary.BigEndian.Uint16(h[2:4]))
	if n < 8 {
		return 0, 0, nil, fmt.Errorf("openflow message length %d too short", n)
	}
	body = make([]byte, n-8)
	if _, err = io.ReadFull(r, body); err != nil {
		return 0, 0, nil, err
	}
	return h[1], binary.BigEndian.Uint32(h[4:8]), body, nil
}

// Done is closed when the connection is lost.
func (c *ofConn) Done() <-chan struct{} { return c.done }

// Close ends the connection.
func (c *ofConn) Close() error { return c.conn.Close() }

func (c *ofConn) nextXID() uint32 { return c.xid.Add(1) }

// newMsg builds a message with a fresh xid.
func (c *ofConn) newMsg(typ uint8, body []byte) []byte {
	b := make([]byte, 8+len(body))
	b[0], b[1] = ofVersion13, typ
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	binary.BigEndian.PutUint32(b[4:], c.nextXID())
	copy(b[8:], body)
	return b
}

// marshal encodes a libOpenflow message and gives it a fresh xid.
func (c *ofConn) marshal(m marshaler) ([]byte, error) {
	b, err := m.MarshalBinary()
	if err != nil {
		return nil, err
	}
	if len(b) < 8 {
		return nil, errors.New("openflow message shorter than its header")
	}
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	binary.BigEndian.PutUint32(b[4:], c.nextXID())
	return b, nil
}

func (c *ofConn) readLoop() {
	var err error
	defer func() {
		c.mu.Lock()
		c.err = err
		for xid, ch := range c.pending {
			ch <- reply{err: fmt.Errorf("openflow connection lost: %w", err)}
			delete(c.pending, xid)
		}
		c.mu.Unlock()
		close(c.done)
		c.conn.Close()
	}()
	for {
		var typ uint8
		var xid uint32
		var body []byte
		typ, xid, body, err = readMsg(c.conn)
		if err != nil {
			return
		}
		switch typ {
		case ofptEchoRequest:
			b := make([]byte, 8+len(body))
			b[0], b[1] = ofVersion13, ofptEchoReply
			binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
			binary.BigEndian.PutUint32(b[4:], xid)
			copy(b[8:], body)
			if err = c.write(b); err != nil {
				return
			}
			continue
		case ofptPacketIn:
			if c.packetIn != nil {
				c.packetIn(body)
			}
			continue
		case ofptError:
			e := &ofError{}
			if len(body) >= 4 {
				e.Type, e.Code = binary.BigEndian.Uint16(body), binary.BigEndian.Uint16(body[2:])
				if e.Type == 0xffff && len(body) >= 4 {
					e.ExpType = e.Code
				}
			}
			c.deliver(xid, reply{err: e})
			continue
		case ofptMultipartReply:
			if len(body) >= 4 && binary.BigEndian.Uint16(body[2:])&1 != 0 { // OFPMPF_REPLY_MORE
				c.mu.Lock()
				c.partial[xid] = append(c.partial[xid], body)
				c.mu.Unlock()
				continue
			}
		}
		c.mu.Lock()
		msgs := append(c.partial[xid], body)
		delete(c.partial, xid)
		c.mu.Unlock()
		c.deliver(xid, reply{msgs: msgs})
	}
}

func (c *ofConn) deliver(xid uint32, r reply) {
	c.mu.Lock()
	ch, ok := c.pending[xid]
	if ok {
		delete(c.pending, xid)
	}
	c.mu.Unlock()
	if ok {
		ch <- r
	}
}

func (c *ofConn) write(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := c.conn.Write(b)
	return err
}

// expect registers interest in the answer to xid before the request is written.
func (c *ofConn) expect(xid uint32) (chan reply, error) {
	ch := make(chan reply, 1)
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.done:
		return nil, fmt.Errorf("openflow connection lost: %w", c.err)
	default:
	}
	c.pending[xid] = ch
	return ch, nil
}

func (c *ofConn) forget(xid uint32) {
	c.mu.Lock()
	delete(c.pending, xid)
	c.mu.Unlock()
}

func xidOf(b []byte) uint32 { return binary.BigEndian.Uint32(b[4:8]) }

// call writes msg and waits for the reply (or error) carrying its xid.
func (c *ofConn) call(ctx context.Context, msg []byte) ([][]byte, error) {
	xid := xidOf(msg)
	ch, err := c.expect(xid)
	if err != nil {
		return nil, err
	}
	if err := c.write(msg); err != nil {
		c.forget(xid)
		return nil, fmt.Errorf("openflow write: %w", err)
	}
	select {
	case r := <-ch:
		return r.msgs, r.err
	case <-ctx.Done():
		c.forget(xid)
		return nil, ctx.Err()
	case <-time.After(10 * time.Second):
		c.forget(xid)
		return nil, errors.New("openflow: no reply within 10s")
	}
}

// bundle applies msgs atomically with an ONF bundle (OpenFlow 1.3 extension 2300/2301):
// either every message takes effect or none does.
func (c *ofConn) bundle(ctx context.Context, msgs [][]byte) error {
	if len(msgs) == 0 {
		return nil
	}
	id := c.nextXID()
	ctrlMsg := func(typ uint16) ([]byte, error) {
		return c.marshal(of.NewBundleControl(&of.BundleControl{BundleID: id, Type: typ, Flags: of.OFPBCT_ATOMIC}))
	}
	// The open request is not waited for: its reply (or error) is delivered before the
	// commit's, since the connection reads in order, and a failed open fails the commit.
	open, err := ctrlMsg(of.OFPBCT_OPEN_REQUEST)
	if err != nil {
		return err
	}
	openCh, err := c.expect(xidOf(open))
	if err != nil {
		return err
	}
	defer c.forget(xidOf(open))
	if err := c.write(open); err != nil {
		return fmt.Errorf("open bundle: %w", err)
	}
	type added struct {
		xid uint32
		ch  chan reply
		i   int
	}
	var adds []added
	defer func() {
		for _, a := range adds {
			c.forget(a.xid)
		}
	}()
	for i, inner := range msgs {
		raw := rawMsg(inner)
		m, err := c.marshal(of.NewBundleAdd(&of.BundleAdd{BundleID: id, Flags: of.OFPBCT_ATOMIC, Message: &raw}))
		if err != nil {
			return fmt.Errorf("bundle add: %w", err)
		}
		xid := xidOf(m)
		// The inner message must carry the bundle add's xid.
		binary.BigEndian.PutUint32(m[16+8+4:], xid)
		ch, err := c.expect(xid)
		if err != nil {
			return err
		}
		adds = append(adds, added{xid, ch, i})
		if err := c.write(m); err != nil {
			return fmt.Errorf("bundle add: %w", err)
		}
	}
	commit, err := ctrlMsg(of.OFPBCT_COMMIT_REQUEST)
	if err != nil {
		return err
	}
	_, commitErr := c.call(ctx, commit)
	select {
	case r := <-openCh:
		if r.err != nil {
			return fmt.Errorf("open bundle: %w", r.err)
		}
	default:
		if commitErr == nil {
			return errors.New("open bundle: no reply before the commit's")
		}
	}
	var errs []error
	for _, a := range adds {
		select {
		case r := <-a.ch:
			if r.err != nil {
				errs = append(errs, fmt.Errorf("bundle message %d: %w", a.i, r.err))
			}
		default:
		}
	}
	if commitErr != nil {
		return errors.Join(append([]error{fmt.Errorf("commit bundle: %w", commitErr)}, errs...)...)
	}
	return errors.Join(errs...)
}

// flowStat is one entry of a flow statistics reply.
type flowStat struct {
	Table    uint8
	Priority uint16
	Cookie   uint64
	Packets  uint64
	Bytes    uint64
}

// flowStats dumps every flow whose cookie matches cookie under mask.
func (c *ofConn) flowStats(ctx context.Context, cookie, mask uint64) ([]flowStat, error) {
	body := make([]byte, 8+40)
	binary.BigEndian.PutUint16(body[0:], 1) // OFPMP_FLOW
	b := body[8:]
	b[0] = 0xff                                 // all tables
	binary.BigEndian.PutUint32(b[4:], of.P_ANY) // out_port
	binary.BigEndian.PutUint32(b[8:], of.OFPG_ANY)
	binary.BigEndian.PutUint64(b[16:], cookie)
	binary.BigEndian.PutUint64(b[24:], mask)
	copy(b[32:], []byte{0, 1, 0, 4, 0, 0, 0, 0}) // empty OXM match
	replies, err := c.call(ctx, c.newMsg(ofptMultipartReq, body))
	if err != nil {
		return nil, fmt.Errorf("flow stats: %w", err)
	}
	var out []flowStat
	for _, r := range replies {
		if len(r) < 8 {
			continue
		}
		r = r[8:]
		for len(r) >= 48 {
			n := int(binary.BigEndian.Uint16(r))
			if n < 48 || n > len(r) {
				return nil, fmt.Errorf("flow stats: bad entry length %d", n)
			}
			out = append(out, flowStat{
				Table:    r[2],
				Priority: binary.BigEndian.Uint16(r[12:]),
				Cookie:   binary.BigEndian.Uint64(r[24:]),
				Packets:  binary.BigEndian.Uint64(r[32:]),
				Bytes:    binary.BigEndian.Uint64(r[40:]),
			})
			r = r[n:]
		}
	}
	return out, nil
}
