package client

import (
	"encoding/json"
	"testing"
)

// A create request says nothing of egress unless asked, and keeps "no outbound traffic" ([]) apart from it.
func TestCreateRequestEgressJSON(t *testing.T) {
	for _, c := range []struct {
		req  CreateRequest
		want string
	}{
		{CreateRequest{MemMiB: 512}, `{"mem_mib":512}`},
		{CreateRequest{Egress: []string{}}, `{"egress":[]}`},
		{CreateRequest{Egress: []string{"10.0.0.1:80"}}, `{"egress":["10.0.0.1:80"]}`},
	} {
		b, err := json.Marshal(c.req)
		if err != nil || string(b) != c.want {
			t.Errorf("%+v: %s %v, want %s", c.req, b, err, c.want)
		}
	}
}
