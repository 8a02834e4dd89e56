package memory

import "testing"

// TestParseBytesAndMachine: sizes in every unit, bad ones refused (0, negative, past int64); the machine's
// memory read on Linux, and the environment override taking its place.
func TestParseBytesAndMachine(t *testing.T) {
	for s, want := range map[string]int64{"24GiB": 24 << 30, "80GB": 80e9, "512 MiB": 512 << 20, "1.5e9": 1.5e9, "7b": 7} {
		if got, err := ParseBytes(s); err != nil || got != want {
			t.Errorf("%q: %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "0", "-1GiB", "lots", "1e19", "NaN"} {
		if _, err := ParseBytes(s); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
	t.Setenv(LimitEnv, "")
	if b, ok, err := MachineBytes(); err != nil || !ok || b < 64<<20 {
		t.Errorf("machine memory %d, %v, %v", b, ok, err)
	}
	t.Setenv(LimitEnv, "2GiB")
	if b, ok, err := MachineBytes(); err != nil || !ok || b != 2<<30 {
		t.Errorf("with $%s: %d, %v, %v", LimitEnv, b, ok, err)
	}
}

// TestFreeDiskBytes: the free space of the temp folder's filesystem is read (Unix).
func TestFreeDiskBytes(t *testing.T) {
	if free, ok := FreeDiskBytes(t.TempDir()); ok && free <= 0 {
		t.Errorf("free disk bytes %d", free)
	}
}
