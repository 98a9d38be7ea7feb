package sandbox

import "testing"

func TestIngressLabel(t *testing.T) {
	id := "sbx_0123456789abcdef0123456789abcdef"
	if got := IngressLabel(id, "8000"); got != "8000-0123456789abcdef0123456789abcdef" {
		t.Fatalf("IngressLabel = %q", got)
	}
	gotID, port, ok := ParseIngressLabel(IngressLabel(id, "8000"))
	if !ok || gotID != id || port != 8000 {
		t.Fatalf("round trip: %q %d %v", gotID, port, ok)
	}
	for _, bad := range []string{
		"", "8000", "8000-", "-0123456789abcdef0123456789abcdef", "0-0123456789abcdef0123456789abcdef",
		"08000-0123456789abcdef0123456789abcdef", "65536-0123456789abcdef0123456789abcdef",
		"123456-0123456789abcdef0123456789abcdef", "80a-0123456789abcdef0123456789abcdef",
		"8000-0123456789ABCDEF0123456789abcdef", "8000-0123456789abcdef0123456789abcde",
		"8000-sbx_0123456789abcdef0123456789abcdef", "8000-0123456789abcdef0123456789abcdef-1",
	} {
		if id, port, ok := ParseIngressLabel(bad); ok {
			t.Errorf("ParseIngressLabel(%q) = %q %d, want refused", bad, id, port)
		}
	}
	if _, port, ok := ParseIngressLabel("65535-0123456789abcdef0123456789abcdef"); !ok || port != 65535 {
		t.Errorf("port 65535: %d %v", port, ok)
	}
}
