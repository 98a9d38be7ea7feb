package security

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/network"
	"github.com/ramify-dev/ramify/internal/testnet"
	"github.com/ramify-dev/ramify/internal/testserver"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The network policy, attacked from inside real sandboxes: the host, other sandboxes (separately created and fork
// siblings) and reserved ranges are refused by default; an egress entry opens exactly what it names; [] closes
// everything; a sandbox cannot take a neighbour's address (ARP or IP). Traffic goes only to the test server's
// bridge, its sandboxes, and a network namespace this test creates.

type netSandbox struct {
	ID     string    `json:"id"`
	Status string    `json:"status"`
	IP     string    `json:"ip"`
	Egress *[]string `json:"egress"`
}

func netCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// netCreate creates a sandbox; egress nil leaves the field out (the default policy).
func netCreate(t *testing.T, s *testserver.Server, egress []string) netSandbox {
	t.Helper()
	body := map[string]any{}
	if egress != nil {
		body["egress"] = egress
	}
	var sb netSandbox
	if err := s.PostJSON(netCtx(t), "/v1/sandboxes", body, &sb); err != nil {
		t.Fatalf("create with egress %q: %v", egress, err)
	}
	return sb
}

// netDo sends a request and returns the status and body.
func netDo(t *testing.T, s *testserver.Server, method, path string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequestWithContext(netCtx(t), method, s.URL+path, rd)
	req.Header.Set("Authorization", "Bearer "+s.Key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func netGet(t *testing.T, s *testserver.Server, id string) netSandbox {
	t.Helper()
	code, b := netDo(t, s, http.MethodGet, "/v1/sandboxes/"+id, nil)
	var sb netSandbox
	if code != http.StatusOK || json.Unmarshal(b, &sb) != nil {
		t.Fatalf("GET %s: %d %s", id, code, b)
	}
	return sb
}

func netSh(t *testing.T, s *testserver.Server, id, cmd string) string {
	t.Helper()
	code, b := netDo(t, s, http.MethodPost, "/v1/sandboxes/"+id+"/exec", map[string]any{"cmd": cmd})
	var res struct {
		Stdout, Stderr string
	}
	if code != http.StatusOK || json.Unmarshal(b, &res) != nil {
		t.Fatalf("exec %q in %s: %d %s", cmd, id, code, b)
	}
	return res.Stdout + res.Stderr
}

// netProbe connects from sandbox id to addr:port and says "reached <greeting>" or "blocked <exception>". The
// policy rejects (TCP reset) what it refuses, so a refusal is immediate; only what isolated bridge ports swallow
// (another sandbox's address on the same bridge) waits for the connect timeout.
func netProbe(t *testing.T, s *testserver.Server, id, addr string, port int) string {
	t.Helper()
	return strings.TrimSpace(netSh(t, s, id, fmt.Sprintf(`python3 -c "
import socket
try:
    s = socket.create_connection(('%s', %d), 5); s.settimeout(10); print('reached', s.recv(100).decode().strip())
except Exception as e:
    print('blocked', type(e).__name__)
"`, addr, port)))
}

// netProbeMany probes several "addr:port" targets from sandbox id at once (threads), so that probes that wait
// for a timeout (what isolated bridge ports swallow) overlap. It returns one netProbe answer per target, or an
// error (it is safe to call from any goroutine).
func netProbeMany(s *testserver.Server, id string, targets []string) ([]string, error) {
	var b strings.Builder
	for _, tg := range targets {
		h, p, _ := net.SplitHostPort(tg)
		fmt.Fprintf(&b, "(%q, %s), ", h, p)
	}
	cmd := fmt.Sprintf(`python3 -c "
import socket, threading
ts = [%s]
out = [None] * len(ts)
def probe(i, a):
    try:
        s = socket.create_connection(a, 5); s.settimeout(10); out[i] = 'reached ' + s.recv(100).decode().strip()
    except Exception as e:
        out[i] = 'blocked ' + type(e).__name__
th = [threading.Thread(target=probe, args=(i, a)) for i, a in enumerate(ts)]
[x.start() for x in th]; [x.join() for x in th]
print('\n'.join(out))
"`, strings.ReplaceAll(b.String(), `"`, `'`))
	body, _ := json.Marshal(map[string]any{"cmd": cmd})
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/v1/sandboxes/"+id+"/exec", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+s.Key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(resp.Body)
	var res struct{ Stdout, Stderr string }
	if resp.StatusCode != http.StatusOK || json.Unmarshal(rb, &res) != nil {
		return nil, fmt.Errorf("exec in %s: %d %s", id, resp.StatusCode, rb)
	}
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if len(lines) != len(targets) {
		return nil, fmt.Errorf("probes from %s: %q %q", id, res.Stdout, res.Stderr)
	}
	return lines, nil
}

func netWantReached(t *testing.T, what, got, greeting string) {
	t.Helper()
	if got != "reached "+greeting {
		t.Errorf("%s: %q, want it reached (%q)", what, got, greeting)
	}
}

func netWantBlocked(t *testing.T, what, got string) {
	t.Helper()
	if !strings.HasPrefix(got, "blocked ") {
		t.Errorf("%s: %q, want it blocked", what, got)
	}
}

// netGreeter listens on addr:0 (on the host) and greets each connection with greeting.
func netGreeter(t *testing.T, addr, greeting string) int {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	testnet.Greet(ln, greeting)
	return ln.Addr().(*net.TCPAddr).Port
}

// netSandboxGreeter starts a listener on 0.0.0.0:port inside sandbox id, checked from inside.
func netSandboxGreeter(t *testing.T, s *testserver.Server, id string, port int, greeting string) {
	t.Helper()
	code, b := netDo(t, s, http.MethodPost, "/v1/sandboxes/"+id+"/run_code", map[string]any{"code": fmt.Sprintf(`import socket, threading
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); srv.bind(('0.0.0.0', %d)); srv.listen()
def serve():
    while True:
        c, _ = srv.accept(); c.sendall(b'%s\n'); c.close()
threading.Thread(target=serve, daemon=True).start()
`, port, greeting)})
	if code != http.StatusOK || bytes.Contains(b, []byte(`"error":{`)) {
		t.Fatalf("start a listener in %s: %d %s", id, code, b)
	}
	netWantReached(t, "the sandbox's own listener", netProbe(t, s, id, "127.0.0.1", port), greeting)
}

// netGateway is the bridge address of the test server's /24 subnet.
func netGateway(ip string) string {
	p := net.ParseIP(ip).To4()
	return net.IPv4(p[0], p[1], p[2], 1).String()
}

func TestNetworkPolicy(t *testing.T) {
	s := testserver.Start(t)
	a := netCreate(t, s, nil)
	gw := netGateway(a.IP)
	p1 := netGreeter(t, gw, "host port one")
	p2 := netGreeter(t, gw, "host port two")
	pAny := netGreeter(t, "0.0.0.0", "host any address")
	open := fmt.Sprintf("%s:%d", gw, p1)
	c := netCreate(t, s, []string{open})
	d := netCreate(t, s, []string{})

	t.Run("HostRefusedByDefault", func(t *testing.T) {
		netWantBlocked(t, "default sandbox to a host service on the bridge address", netProbe(t, s, a.ID, gw, p1))
		netWantBlocked(t, "default sandbox to a host service on 0.0.0.0", netProbe(t, s, a.ID, gw, pAny))
	})

	t.Run("IPv6Dropped", func(t *testing.T) {
		// The IPv4 rules do not see IPv6: the bridge drops every frame that is not ARP or IPv4, so a sandbox
		// cannot reach the host's link-local address (which any service listening on [::] answers).
		br, err := netlink.LinkByName(netBridgeOf(t, gw))
		if err != nil {
			t.Fatal(err)
		}
		addrs, _ := netlink.AddrList(br, netlink.FAMILY_V6)
		var ll string
		for _, a := range addrs {
			if a.IP.IsLinkLocalUnicast() {
				ll = a.IP.String()
			}
		}
		if ll == "" {
			t.Skip("the bridge has no IPv6 link-local address (IPv6 disabled on this host): nothing to reach")
		}
		p6 := netGreeter(t, "::", "host over ipv6")
		// Until duplicate address detection ends, the sandbox's own link-local address cannot be used (the probe
		// would fail for that reason): wait for it.
		for _, id := range []string{a.ID} {
			if out := netSh(t, s, id, "for i in $(seq 100); do [ -z \"$(ip -6 -o addr show dev eth0 tentative)\" ] && [ -n \"$(ip -6 -o addr show dev eth0 scope link)\" ] && echo ready && exit; sleep 0.1; done"); !strings.Contains(out, "ready") {
				t.Fatalf("the sandbox's IPv6 link-local address never became usable: %q", out)
			}
		}
		netWantBlocked(t, "default sandbox to the host's IPv6 link-local address", netProbe(t, s, a.ID, ll+"%eth0", p6))
	})

	t.Run("EgressEntryOpensExactlyThat", func(t *testing.T) {
		netWantReached(t, "the opened host port", netProbe(t, s, c.ID, gw, p1), "host port one")
		netWantBlocked(t, "another port of the same address", netProbe(t, s, c.ID, gw, p2))
		netWantBlocked(t, "the host's 0.0.0.0 service", netProbe(t, s, c.ID, gw, pAny))
	})

	t.Run("EmptyEgressBlocksAll", func(t *testing.T) {
		netWantBlocked(t, "egress [] to the host port others may open", netProbe(t, s, d.ID, gw, p1))
	})

	t.Run("GetShowsPolicy", func(t *testing.T) {
		if g := netGet(t, s, a.ID); g.Egress != nil {
			t.Errorf("default sandbox: egress %v, want null", *g.Egress)
		}
		if g := netGet(t, s, c.ID); g.Egress == nil || len(*g.Egress) != 1 || (*g.Egress)[0] != open {
			t.Errorf("sandbox c: egress %v, want [%s]", g.Egress, open)
		}
		if g := netGet(t, s, d.ID); g.Egress == nil || len(*g.Egress) != 0 {
			t.Errorf("sandbox d: egress %v, want []", g.Egress)
		}
	})

	t.Run("MalformedIs400", func(t *testing.T) {
		for _, bad := range []any{[]string{"10.0.0.0/33"}, []string{"example.com:0"}, []string{""}, []string{"::1"},
			[]string{"a..b"}, "10.0.0.0/8", []any{1}} {
			code, b := netDo(t, s, http.MethodPost, "/v1/sandboxes", map[string]any{"egress": bad})
			if code != http.StatusBadRequest || !bytes.Contains(b, []byte("egress")) {
				t.Errorf("create with egress %v: %d %s, want 400 naming egress", bad, code, b)
			}
		}
		code, b := netDo(t, s, http.MethodPost, "/v1/sandboxes", map[string]any{"egress": []string{"10.0.0.0/8", "10.0.0.0/33"}})
		if want := `{"error":"egress[1] \"10.0.0.0/33\": not an IPv4 CIDR (like 10.0.0.0/8)"}`; code != http.StatusBadRequest || strings.TrimSpace(string(b)) != want {
			t.Errorf("create with a bad CIDR: %d %s, want 400 %s", code, b, want)
		}
		code, b = netDo(t, s, http.MethodPost, "/v1/sandboxes/"+a.ID+"/fork", map[string]any{"egress": []string{"1.2.3"}})
		if code != http.StatusBadRequest || !bytes.Contains(b, []byte("egress")) {
			t.Errorf("fork with a malformed egress: %d %s, want 400", code, b)
		}
	})

	t.Run("OtherSandboxesUnreachable", func(t *testing.T) {
		b := netCreate(t, s, nil)
		netSandboxGreeter(t, s, b.ID, 8765, "sandbox b")
		kids, err := s.Client.Fork(netCtx(t), a.ID, 2)
		if err != nil {
			t.Fatal(err)
		}
		k0, k1 := netGet(t, s, kids[0]), netGet(t, s, kids[1])
		netSandboxGreeter(t, s, k0.ID, 8766, "fork child zero")
		bAddr, k0Addr := net.JoinHostPort(b.IP, "8765"), net.JoinHostPort(k0.IP, "8766")
		probes := []struct {
			from    string
			targets []string
			what    []string
		}{
			{a.ID, []string{bAddr, k0Addr}, []string{"a separately created sandbox", "the fork parent to its child"}},
			{k1.ID, []string{k0Addr, bAddr, net.JoinHostPort(gw, fmt.Sprint(p1))},
				[]string{"a fork sibling", "a fork child to a separately created sandbox", "a fork child to the host"}},
		}
		outs := make([][]string, len(probes))
		errs := make([]error, len(probes))
		var wg sync.WaitGroup
		for i, p := range probes {
			wg.Add(1)
			go func() { defer wg.Done(); outs[i], errs[i] = netProbeMany(s, p.from, p.targets) }()
		}
		wg.Wait()
		for i, p := range probes {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			for j, what := range p.what {
				netWantBlocked(t, what, outs[i][j])
			}
		}
	})

	t.Run("ForkChildrenInheritPolicy", func(t *testing.T) {
		kids, err := s.Client.Fork(netCtx(t), c.ID, 1)
		if err != nil {
			t.Fatal(err)
		}
		k := netGet(t, s, kids[0])
		if k.Egress == nil || len(*k.Egress) != 1 || (*k.Egress)[0] != open {
			t.Errorf("child of c: egress %v, want [%s]", k.Egress, open)
		}
		netWantReached(t, "child of c to the opened port", netProbe(t, s, k.ID, gw, p1), "host port one")
		netWantBlocked(t, "child of c to another port", netProbe(t, s, k.ID, gw, p2))
	})

	t.Run("PauseResumeAndForkOfPaused", func(t *testing.T) {
		e := netCreate(t, s, []string{})
		if _, _, err := s.Client.Pause(netCtx(t), e.ID); err != nil {
			t.Fatal(err)
		}
		if sb, err := s.Client.WaitStatus(netCtx(t), e.ID, "paused"); err != nil {
			t.Fatalf("wait paused: %v %+v", err, sb)
		}
		var res struct {
			Children []string `json:"children"`
		}
		if err := s.PostJSON(netCtx(t), "/v1/sandboxes/"+e.ID+"/fork", map[string]any{"egress": []string{open}}, &res); err != nil || len(res.Children) != 1 {
			t.Fatalf("fork of paused with egress: %v %v", res, err)
		}
		if sb, err := s.Client.WaitStatus(netCtx(t), res.Children[0], "running"); err != nil {
			t.Fatalf("wait for the child to run: %v %+v", err, sb)
		}
		k := netGet(t, s, res.Children[0])
		if k.Egress == nil || len(*k.Egress) != 1 || (*k.Egress)[0] != open {
			t.Errorf("child of the paused sandbox: egress %v, want [%s]", k.Egress, open)
		}
		netWantReached(t, "child forked with an egress entry", netProbe(t, s, k.ID, gw, p1), "host port one")
		netWantBlocked(t, "child forked with an egress entry, other port", netProbe(t, s, k.ID, gw, p2))
		if _, _, err := s.Client.Resume(netCtx(t), e.ID); err != nil {
			t.Fatal(err)
		}
		if sb, err := s.Client.WaitStatus(netCtx(t), e.ID, "running"); err != nil {
			t.Fatalf("wait running: %v %+v", err, sb)
		}
		if g := netGet(t, s, e.ID); g.Egress == nil || len(*g.Egress) != 0 {
			t.Errorf("resumed sandbox: egress %v, want []", g.Egress)
		}
		netWantBlocked(t, "resumed sandbox with egress []", netProbe(t, s, e.ID, gw, p1))
	})

	t.Run("PublicAllowedByDefault", func(t *testing.T) {
		pub, port := netPublicPeer(t)
		netWantReached(t, "default sandbox to a public address", netProbe(t, s, a.ID, pub, port), "public peer")
		if t.Failed() {
			out, _ := exec.Command("sh", "-c", "nft list table ip ramify_"+netBridgeOf(t, gw)+"; ip route get "+pub).CombinedOutput()
			t.Logf("the server's rules and the route (for diagnosis):\n%s", out)
			t.Logf("the sandbox's routes and neighbours: %s", netSh(t, s, a.ID, "ip route; ip neigh"))
		}
		netWantBlocked(t, "egress [] to a public address", netProbe(t, s, d.ID, pub, port))
		netWantBlocked(t, "an allowlist without it to a public address", netProbe(t, s, c.ID, pub, port))

		// A server restart rewrites the rules but keeps the running sandboxes' pins and policies.
		s.Restart()
		netWantReached(t, "after a restart, the default sandbox to a public address", netProbe(t, s, a.ID, pub, port), "public peer")
		netWantBlocked(t, "after a restart, the default sandbox to the host", netProbe(t, s, a.ID, gw, p1))
		netWantReached(t, "after a restart, the opened host port", netProbe(t, s, c.ID, gw, p1), "host port one")
		netWantBlocked(t, "after a restart, another host port", netProbe(t, s, c.ID, gw, p2))
		netWantBlocked(t, "after a restart, egress [] to a public address", netProbe(t, s, d.ID, pub, port))
	})
}

// netPublicPeer creates a network namespace holding a public-looking address (a documentation range the
// policy treats as public and this host does not use), routed from the host via a gateway on a network of the
// host's own (a veth), as the internet is, with a greeter on it. Removed when the test ends.
func netPublicPeer(t *testing.T) (string, int) {
	t.Helper()
	nets := testnet.Need(t, 2)
	p := testnet.NewPeer(t, nets[0], nets[1])
	return p.Public.String(), p.Listen(t, p.Public, "public peer")
}

// TestNetworkSpoofing: a sandbox cannot take its neighbour's address. The attacker forges ARP replies and
// requests that say "the neighbour's IP is at my MAC", puts the neighbour's IP on its own eth0, and sends an IP
// packet with the neighbour's source address; the host's ARP entry for the neighbour must not move, the host
// must keep reaching the neighbour, and the forged packet must not arrive.
//
// Sandbox root has neither CAP_NET_RAW nor CAP_NET_ADMIN (the capability policy), so the test first checks that
// it cannot even try, then sends the attacker's frames itself, from inside the attacker's network namespace, as
// sandbox code would if it had those capabilities (or a kernel bug that bypasses them): the bridge's pin must
// hold on its own.
func TestNetworkSpoofing(t *testing.T) {
	s := testserver.Start(t)
	first := netCreate(t, s, []string{})
	gw := netGateway(first.IP)
	udp, err := net.ListenPacket("udp4", net.JoinHostPort(gw, "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { udp.Close() })
	uport := udp.LocalAddr().(*net.UDPAddr).Port
	allow := []string{fmt.Sprintf("%s:%d", gw, uport)}
	victim := netCreate(t, s, allow)
	attacker := netCreate(t, s, allow)
	netSandboxGreeter(t, s, victim.ID, 8765, "the victim")
	attackerNS := netSandboxNetns(t, attacker.ID)

	br, err := net.InterfaceByName(netBridgeOf(t, gw))
	if err != nil {
		t.Fatal(err)
	}
	victimIP, gwIP := net.ParseIP(victim.IP).To4(), net.ParseIP(gw).To4()
	victimMAC := network.MACFor(victimIP).String()
	attackerMAC := network.MACFor(net.ParseIP(attacker.IP))
	hostDial := func() string {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(victim.IP, "8765"), 5*time.Second)
		if err != nil {
			return "dial: " + err.Error()
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(c)
		return strings.TrimSpace(string(b))
	}
	neighMAC := func() string {
		ns, _ := netlink.NeighList(br.Index, netlink.FAMILY_V4)
		for _, n := range ns {
			if n.IP.Equal(victimIP) {
				return n.HardwareAddr.String()
			}
		}
		return ""
	}
	if got := hostDial(); got != "the victim" {
		t.Fatalf("host to victim before the attack: %q", got)
	}
	if got := neighMAC(); got != victimMAC {
		t.Fatalf("host's ARP entry for the victim: %q, want %s", got, victimMAC)
	}

	t.Run("NoRawSocketsOrAddressChangesInside", func(t *testing.T) {
		out := netSh(t, s, attacker.ID, fmt.Sprintf(`python3 -c "
import socket
for fam, typ in ((socket.AF_PACKET, socket.SOCK_RAW), (socket.AF_INET, socket.SOCK_RAW)):
    try:
        socket.socket(fam, typ, 255); print('raw socket opened')
    except PermissionError:
        print('raw socket refused')
"; ip addr add %s/32 dev eth0 && echo address added || echo address refused`, victim.IP))
		if strings.Contains(out, "opened") || strings.Contains(out, "address added") {
			t.Logf("sandbox root can send raw frames or change its addresses (%q): the pins below are what stops spoofing", out)
		}
	})

	t.Run("ForgedARP", func(t *testing.T) {
		bc := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
		var frames [][]byte
		// Replies and requests claiming the victim's IP, for longer than the neighbour table's lock time (1 s).
		for _, f := range [][]byte{
			netARP(bc, attackerMAC, 2, attackerMAC, victimIP, bc, victimIP),
			netARP(bc, attackerMAC, 2, attackerMAC, victimIP, bc, gwIP),
			netARP(bc, attackerMAC, 1, attackerMAC, victimIP, make(net.HardwareAddr, 6), gwIP),
		} {
			frames = append(frames, f)
		}
		for i := 0; i < 30; i++ {
			netInject(t, attackerNS, frames)
			time.Sleep(100 * time.Millisecond)
		}
		if got := neighMAC(); got != victimMAC {
			t.Errorf("host's ARP entry for the victim moved to %q (victim %s)", got, victimMAC)
		}
		if got := hostDial(); got != "the victim" {
			t.Errorf("host to victim after forged ARP: %q", got)
		}
	})

	t.Run("NeighbourIPOnOwnEth0", func(t *testing.T) {
		h, err := netlink.NewHandleAt(attackerNS)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		eth, err := h.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		if err := h.AddrAdd(eth, &netlink.Addr{IPNet: &net.IPNet{IP: victimIP, Mask: net.CIDRMask(32, 32)}}); err != nil && !errors.Is(err, unix.EEXIST) {
			t.Fatal(err)
		}
		// Make the host ask again: both the victim and the attacker now answer for the victim's IP.
		netlink.NeighDel(&netlink.Neigh{LinkIndex: br.Index, IP: victimIP})
		for i := 0; i < 5; i++ {
			if got := hostDial(); got != "the victim" {
				t.Errorf("host to victim with the attacker claiming its IP: %q", got)
			}
		}
		if got := neighMAC(); got != victimMAC {
			t.Errorf("host's ARP entry for the victim: %q, want %s", got, victimMAC)
		}
	})

	t.Run("ForgedSourceIP", func(t *testing.T) {
		got := make(chan string, 16)
		go func() {
			buf := make([]byte, 100)
			for {
				n, from, err := udp.ReadFrom(buf)
				if err != nil {
					close(got)
					return
				}
				got <- string(buf[:n]) + " from " + from.String()
			}
		}()
		// The victim's allowlist opens this port: without the pin, a packet with its source would pass.
		forged := netUDPFrame(network.MACFor(gwIP), attackerMAC, victimIP, gwIP, 40000, uint16(uport), []byte("forged"))
		netInject(t, attackerNS, [][]byte{forged, forged, forged})
		out := netSh(t, s, attacker.ID, fmt.Sprintf(`python3 -c "
import socket
socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'genuine', ('%s', %d)); print('sent')"`, gw, uport))
		if !strings.Contains(out, "sent") {
			t.Fatalf("sending the genuine datagram: %s", out)
		}
		timeout := time.After(20 * time.Second)
		for {
			select {
			case m := <-got:
				if strings.HasPrefix(m, "forged") {
					t.Fatalf("the host received a packet with the victim's forged source: %s", m)
				}
				if strings.HasPrefix(m, "genuine") {
					if !strings.Contains(m, attacker.IP+":") {
						t.Errorf("genuine datagram came from %s, want %s", m, attacker.IP)
					}
					return
				}
			case <-timeout:
				t.Fatal("the attacker's genuine datagram never arrived")
			}
		}
	})
}

// netSandboxNetns opens the network namespace of sandbox id, through a process of its cgroup.
func netSandboxNetns(t *testing.T, id string) netns.NsHandle {
	t.Helper()
	files, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil || !bytes.Contains(b, []byte("/"+id)) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(f)))
		if err != nil {
			continue
		}
		ns, err := netns.GetFromPid(pid)
		if err != nil {
			continue
		}
		t.Cleanup(func() { ns.Close() })
		return ns
	}
	t.Fatalf("no process of sandbox %s found", id)
	return 0
}

// netInject sends raw Ethernet frames out of eth0 inside ns.
func netInject(t *testing.T, ns netns.NsHandle, frames [][]byte) {
	t.Helper()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	fd, serr := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(netHtons(unix.ETH_P_ALL)))
	ifi, ierr := net.InterfaceByName("eth0")
	if err := netns.Set(orig); err != nil {
		panic(err) // this thread must not go back to the pool in the sandbox's namespace
	}
	runtime.UnlockOSThread()
	if serr != nil || ierr != nil {
		t.Fatalf("raw socket in the sandbox's namespace: %v %v", serr, ierr)
	}
	defer unix.Close(fd)
	sa := &unix.SockaddrLinklayer{Ifindex: ifi.Index, Protocol: netHtons(unix.ETH_P_ALL)}
	for _, f := range frames {
		if err := unix.Sendto(fd, f, 0, sa); err != nil {
			t.Fatalf("send a frame: %v", err)
		}
	}
}

func netHtons(v uint16) uint16 { return v<<8 | v>>8 }

// netARP builds an Ethernet frame holding an ARP packet.
func netARP(dst, src net.HardwareAddr, op uint16, sha net.HardwareAddr, spa net.IP, tha net.HardwareAddr, tpa net.IP) []byte {
	f := append(append(append([]byte{}, dst...), src...), 0x08, 0x06)
	f = append(f, 0, 1, 0x08, 0x00, 6, 4, byte(op>>8), byte(op))
	f = append(append(f, sha...), spa.To4()...)
	return append(append(f, tha...), tpa.To4()...)
}

// netUDPFrame builds an Ethernet frame holding an IPv4 UDP datagram (UDP checksum 0: none).
func netUDPFrame(dst, src net.HardwareAddr, sip, dip net.IP, sport, dport uint16, data []byte) []byte {
	ulen := 8 + len(data)
	ip := []byte{0x45, 0, byte((20 + ulen) >> 8), byte(20 + ulen), 0, 1, 0, 0, 64, 17, 0, 0}
	ip = append(append(ip, sip.To4()...), dip.To4()...)
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(ip[i])<<8 | uint32(ip[i+1])
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	ip[10], ip[11] = byte(^sum>>8), byte(^sum)
	udp := []byte{byte(sport >> 8), byte(sport), byte(dport >> 8), byte(dport), byte(ulen >> 8), byte(ulen), 0, 0}
	f := append(append(append([]byte{}, dst...), src...), 0x08, 0x00)
	return append(append(append(f, ip...), udp...), data...)
}

// netBridgeOf finds the host interface holding gw (the test server's bridge).
func netBridgeOf(t *testing.T, gw string) string {
	t.Helper()
	ifs, _ := net.Interfaces()
	for _, i := range ifs {
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.String() == gw {
				return i.Name
			}
		}
	}
	t.Fatalf("no interface holds %s", gw)
	return ""
}

// TestNetworkEgressAllowFlag: --egress-allow opens a range for sandboxes on the default policy (here all of
// 10/8, which holds the test server's bridge address); a sandbox with its own list is not widened by it, and
// other sandboxes stay out of reach.
func TestNetworkEgressAllowFlag(t *testing.T) {
	s := testserver.Start(t, "--egress-allow", "10.0.0.0/8")
	a := netCreate(t, s, nil)
	gw := netGateway(a.IP)
	p1 := netGreeter(t, gw, "host port one")
	d := netCreate(t, s, []string{})
	b := netCreate(t, s, nil)
	netSandboxGreeter(t, s, b.ID, 8765, "sandbox b")
	netWantReached(t, "default sandbox to a range the operator opened", netProbe(t, s, a.ID, gw, p1), "host port one")
	netWantBlocked(t, "egress [] despite the operator's range", netProbe(t, s, d.ID, gw, p1))
	netWantBlocked(t, "another sandbox inside the operator's range", netProbe(t, s, a.ID, b.IP, 8765))
}

// TestNetworkHostLANRefused: the networks the host is directly connected to (its LAN, a cloud VPC subnet) are
// refused to default sandboxes even when they are on public-looking addresses, which the private ranges do not
// cover: a machine on the host's LAN, the LAN's gateway and the host's own address there. The internet behind
// that gateway stays reachable (forwarded, not addressed to the gateway). A network the host joins while the
// server runs is refused within seconds; an egress entry or --egress-allow naming a LAN address opens it.
func TestNetworkHostLANRefused(t *testing.T) {
	nets := testnet.Need(t, 2)
	lanHost := testnet.NewPeer(t, nets[0], netip.Prefix{}) // a machine on the host's LAN
	inet := testnet.NewPeer(t, nets[0], nets[1])           // the LAN's gateway, with an internet address behind it
	lanPort := lanHost.Listen(t, lanHost.PeerIP, "lan host")
	gwPort := inet.Listen(t, inet.PeerIP, "lan gateway")
	pubPort := inet.Listen(t, inet.Public, "public peer")
	hostPort := netGreeter(t, lanHost.HostIP.String(), "host on its lan")
	lanAddr := netip.AddrPortFrom(lanHost.PeerIP, uint16(lanPort)).String()

	s := testserver.Start(t)
	a := netCreate(t, s, nil)
	c := netCreate(t, s, []string{lanAddr})

	t.Run("RefusedByDefault", func(t *testing.T) {
		got, err := netProbeMany(s, a.ID, []string{lanAddr,
			netip.AddrPortFrom(inet.PeerIP, uint16(gwPort)).String(),
			netip.AddrPortFrom(lanHost.HostIP, uint16(hostPort)).String(),
			netip.AddrPortFrom(inet.Public, uint16(pubPort)).String()})
		if err != nil {
			t.Fatal(err)
		}
		netWantBlocked(t, "default sandbox to a machine on the host's LAN "+lanAddr, got[0])
		netWantBlocked(t, "default sandbox to the LAN's gateway", got[1])
		netWantBlocked(t, "default sandbox to the host's own address on its LAN", got[2])
		netWantReached(t, "default sandbox to the internet through the LAN's gateway", got[3], "public peer")
		if t.Failed() {
			out, _ := exec.Command("sh", "-c", "nft list table ip ramify_"+s.Bridge()+"; ip -4 addr; ip -4 route").CombinedOutput()
			t.Logf("the server's rules, the host's addresses and routes (for diagnosis):\n%s", out)
		}
	})

	t.Run("EgressEntryOpensExactlyIt", func(t *testing.T) {
		netWantReached(t, "egress entry naming the LAN machine", netProbe(t, s, c.ID, lanHost.PeerIP.String(), lanPort), "lan host")
		netWantBlocked(t, "the same list to the LAN's gateway", netProbe(t, s, c.ID, inet.PeerIP.String(), gwPort))
	})

	t.Run("JoinedWhileRunning", func(t *testing.T) {
		late := testnet.NewPeer(t, nets[0], netip.Prefix{})
		port := late.Listen(t, late.PeerIP, "late lan host")
		// The server reads the host's networks every second: within a few, the new one is refused.
		var got string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
			if got = netProbe(t, s, a.ID, late.PeerIP.String(), port); strings.HasPrefix(got, "blocked ") {
				break
			}
		}
		netWantBlocked(t, "a LAN the host joined while the server runs, after 10 s", got)
	})

	t.Run("EgressAllowFlagOpensIt", func(t *testing.T) {
		s2 := testserver.Start(t, "--egress-allow", lanHost.PeerIP.String())
		b := netCreate(t, s2, nil)
		netWantReached(t, "default sandbox to the LAN machine the operator opened", netProbe(t, s2, b.ID, lanHost.PeerIP.String(), lanPort), "lan host")
		netWantBlocked(t, "another LAN address (the gateway)", netProbe(t, s2, b.ID, inet.PeerIP.String(), gwPort))
		netWantReached(t, "the internet", netProbe(t, s2, b.ID, inet.Public.String(), pubPort), "public peer")
	})
}

// A sandbox's host veth deleted behind the server's back (`ip link del` on the host, a host network manager)
// takes the sandbox's eth0 with it: the sandbox ran on, listed running, cut off for good. The server looks for
// such ports every 5 s and makes the pair again, as it was (address, route, pin, egress policy): the sandbox
// reaches what it reached before, and is still refused what it was refused, its processes untouched.
func TestNetworkHostVethDeletedIsMadeAgain(t *testing.T) {
	s := testserver.Start(t)
	addr, port := netPublicPeer(t)
	sb := netCreate(t, s, nil)
	gw := netGateway(sb.IP)
	hostPort := netGreeter(t, gw, "host port")
	netWantReached(t, "default sandbox to the public peer", netProbe(t, s, sb.ID, addr, port), "public peer")
	pid := strings.TrimSpace(netSh(t, s, sb.ID, "echo $PPID"))
	veth, err := netlink.LinkByName(network.VethName(sb.ID))
	if err != nil {
		t.Fatalf("the sandbox's host veth: %v", err)
	}
	if err := netlink.LinkDel(veth); err != nil {
		t.Fatal(err)
	}
	if got := netProbe(t, s, sb.ID, addr, port); !strings.HasPrefix(got, "blocked") {
		t.Fatalf("with its veth deleted the sandbox still reached the peer: %s", got)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := netProbe(t, s, sb.ID, addr, port)
		if strings.HasPrefix(got, "reached") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after its host veth was deleted the sandbox still cannot reach the peer: %s", got)
		}
		time.Sleep(time.Second)
	}
	netWantBlocked(t, "the remade port to a host service", netProbe(t, s, sb.ID, gw, hostPort))
	if got := strings.TrimSpace(netSh(t, s, sb.ID, "echo $PPID")); got != pid {
		t.Errorf("the sandbox's agent changed: pid %s, was %s", got, pid)
	}
	if l, err := netlink.LinkByName(network.VethName(sb.ID)); err != nil || l.Attrs().MasterIndex == 0 || l.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("the remade host veth: %+v %v", l, err)
	}
}
