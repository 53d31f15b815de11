package refmodel

// The TCP window (bpf/lib/tcpwin.h, docs/conntrack.md "The window"): the one rule the
// conntrack model's entries and the NAT model's flows note and judge with.
const (
	// TCPCloseWindow is how far past the other side's noted acknowledgment a FIN or RST
	// may lie and still close a flow (CB_TCP_CLOSE_WINDOW).
	TCPCloseWindow = 1 << 23
	// TCPNoteStep is how far an acknowledgment number must move from the noted one to be
	// noted again (CB_TCP_NOTE_STEP).
	TCPNoteStep = 1 << 20
	// TCPRSTWindow is how far past it a RST may lie (CB_TCP_RST_WINDOW): one step, where
	// the RST an endpoint that checks (RFC 5961) takes lies.
	TCPRSTWindow = TCPNoteStep
)

// noteDue says whether ack (0: none) is to be noted over ref (0: none).
func noteDue(ack, ref uint32) bool { return ack != 0 && (ref == 0 || ack-ref >= TCPNoteStep) }

// noteAck notes ack in *ref when due (cb_tcp_note): true when it wrote.
func noteAck(ref *uint32, ack uint32) bool {
	if !noteDue(ack, *ref) {
		return false
	}
	*ref = ack
	return true
}

// inWindow says whether a FIN or RST (rst: RST set, whatever else) with sequence number
// seq may close a flow whose other side's noted acknowledgment is ref (0: none,
// believed): cb_tcp_in_window.
func inWindow(seq, ref uint32, rst bool) bool {
	if rst {
		return ref == 0 || seq-ref < TCPRSTWindow
	}
	return ref == 0 || seq-ref < TCPCloseWindow
}
