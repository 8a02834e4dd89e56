package memory

import (
	"bytes"
	"strings"
	"testing"
)

// TestXLADumpDigest reads hand-written dumps in XLA's documented text formats (buffer_assignment.cc's allocations
// and values, hlo_live_range.cc's ToString, the optimised HLO): the largest module is chosen, the peak is the
// dump's own "Live ranges at T (peak)" or, without it, the sweep's, and each live value is named with the op that
// made it.
func TestXLADumpDigest(t *testing.T) {
	for _, dir := range []string{"testdata/xladump/peak", "testdata/xladump/sweep"} {
		d, err := XLADumpDigest(dir, "", 3)
		if err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		if !strings.Contains(d.Module, "train-step") || d.PeakTime != 5 || d.PeakBytes != 17825792 || d.Values != 5 || d.TotalBytes != 17830916 {
			t.Errorf("%s: module %s, peak %d B at %d, %d values, total %d", dir, d.Module, d.PeakBytes, d.PeakTime, d.Values, d.TotalBytes)
		}
		if len(d.Live) != 3 || d.Live[0].Bytes != 4194304 {
			t.Fatalf("%s: live %+v", dir, d.Live)
		}
		ops := map[string]string{}
		for _, v := range d.Live {
			ops[v.Name] = v.Op
		}
		if ops["custom-call.3{0}"] != "custom-call __cublas$gemm" || ops["fusion.7{}"] != "fusion kInput" || ops["p0.1{}"] != "parameter" {
			t.Errorf("%s: ops %v", dir, ops)
		}
		groups := map[string]XLADumpGroup{}
		for _, g := range d.ByOp {
			groups[g.Op+" "+g.Shape] = g
		}
		if g := groups["parameter f32[1024,1024]"]; g.Count != 2 || g.Bytes != 8388608 {
			t.Errorf("%s: by op %+v", dir, d.ByOp)
		}
		var b bytes.Buffer
		if err := d.WriteText(&b); err != nil || !strings.Contains(b.String(), "peak 17.000 MiB at schedule time 5") || !strings.Contains(b.String(), "fusion kInput") {
			t.Errorf("%s: text %q", dir, b.String())
		}
	}
	d, err := XLADumpDigest("testdata/xladump/peak", "rng-init", 0)
	if err != nil || d.PeakBytes != 16 {
		t.Errorf("match rng-init: %+v, %v", d, err)
	}
	if _, err := XLADumpDigest(t.TempDir(), "", 0); err == nil || !strings.Contains(err.Error(), "--xla_dump_to") {
		t.Errorf("an empty folder: %v", err)
	}
}
