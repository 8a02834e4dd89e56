package finetune

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/internal/readfile"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/safetensors"
)

// Files of a training checkpoint folder.
const (
	StateFile     = "trainer_state.json"
	TrainableFile = "trainable.safetensors"
	OptimizerFile = "optimizer.safetensors"
)

// savedState is trainer_state.json.
type savedState struct {
	Version int             `json:"version"`
	Step    int             `json:"step"`
	Config  Config          `json:"config"`
	Data    json.RawMessage `json:"data_position"`
	// RNG is the training steps' random-number state.
	RNG []uint64 `json:"rng"`
	// ModelFingerprint hashes the base parameters' names, shapes and bytes, so a resume on another base model is
	// refused.
	ModelFingerprint string `json:"model_fingerprint"`
	// Checksums are the SHA-256 of the checkpoint's tensor files by name, checked by Resume (and so by export)
	// before they are read. Every memfit checkpoint has carried them since 2026-11-24 (format version 1 both
	// before and after, so nothing tells an older checkpoint from one whose checksums were deleted, and memfit
	// had no release before then): one without them, or without the sum of one of its tensor files, is refused.
	Checksums map[string]string `json:"checksums,omitempty"`
	// Adapter is the adapters' PEFT config (type and settings) of a run with adapters, checked by Resume.
	Adapter map[string]any `json:"adapter,omitempty"`
	// Eval is where the run's validation stands (runs with a validation set), EvalData which set it is.
	Eval     *EvalState       `json:"eval,omitempty"`
	EvalData *evalSetIdentity `json:"eval_data,omitempty"`
}

// adapterConfig returns the PEFT config of the run's adapters (nil without adapters), as JSON would re-read it.
func (t *Trainer) adapterConfig() (map[string]any, error) {
	if t.Adapters == nil || len(t.Adapters.Layers) == 0 {
		return nil, nil
	}
	c := t.Adapters.Adapters[t.Adapters.Paths()[0]].PEFTConfig(nil)
	raw, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	out := map[string]any{}
	return out, json.Unmarshal(raw, &out)
}

// fileSHA256 returns the hex SHA-256 of a file's bytes.
func fileSHA256(path string) (string, error) {
	f, err := readfile.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ErrCorruptCheckpoint is returned by Resume when a checkpoint's tensor file does not match its checksum.
var ErrCorruptCheckpoint = errors.New("corrupt checkpoint")

// Save writes a checkpoint of the run to dir: the trainable tensors, the optimizer state, the step, the config
// and the data position. It is written to a temporary folder renamed into place, so a crash during the save
// leaves the previous checkpoints intact and never a half-written one.
func (t *Trainer) Save(dir string, data Iterator) error {
	if _, _, err := t.Sync(); err != nil {
		return err // a step that failed since the last sync: Step and the tensors are from before it
	}
	tmp, err := tempDir(dir)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var pos json.RawMessage
	if data != nil {
		if pos, err = data.State(); err != nil {
			return fmt.Errorf("saving the data position: %w", err)
		}
	}
	fp, err := t.fingerprint()
	if err != nil {
		return err
	}
	var rng []uint64
	if err := tensors.ConstFlatData[uint64](t.RNG, func(f []uint64) { rng = append(rng, f...) }); err != nil {
		return err
	}
	if err := safetensors.WriteTensors(filepath.Join(tmp, TrainableFile), t.Train, "", nil); err != nil {
		return err
	}
	opt := map[string]*tensors.Tensor{}
	for n, m := range t.M {
		opt["m."+n] = m
	}
	for n, v := range t.V {
		opt["v."+n] = v
	}
	for i, m := range t.Mesa {
		opt[fmt.Sprintf("mesa.%d", i)] = m
	}
	if err := safetensors.WriteTensors(filepath.Join(tmp, OptimizerFile), opt, "", nil); err != nil {
		return err
	}
	sums := map[string]string{}
	for _, f := range []string{TrainableFile, OptimizerFile} {
		if sums[f], err = fileSHA256(filepath.Join(tmp, f)); err != nil {
			return err
		}
	}
	if t.initAdapter != nil {
		kept, err := t.initAdapter.copyInto(filepath.Join(tmp, InitAdapterDir))
		if err != nil {
			return err
		}
		maps.Copy(sums, kept)
	}
	ac, err := t.adapterConfig()
	if err != nil {
		return err
	}
	var eval *EvalState
	if t.EvalState != (EvalState{}) {
		eval = &t.EvalState
	}
	state, err := json.MarshalIndent(savedState{Version: 1, Step: t.Step, Config: t.Config, Data: pos, RNG: rng,
		ModelFingerprint: fp, Checksums: sums, Adapter: ac, Eval: eval, EvalData: t.validationIdentity()}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, StateFile), append(state, '\n'), 0o644); err != nil {
		return err
	}
	if err := replaceDir(tmp, dir); err != nil {
		return err
	}
	t.keptInitAdapter(dir)
	return nil
}

// tempDir makes the temporary folder a checkpoint dir is written into (beside it, ".<name>.tmp-*"), readable as
// its parent folder is: os.MkdirTemp makes it 0700, which left a shared run's checkpoints unreadable to the
// other users that can read the run folder (ro03).
func tempDir(dir string) (string, error) {
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".tmp-")
	if err != nil {
		return "", err
	}
	if st, err := os.Stat(parent); err == nil {
		if err := os.Chmod(tmp, st.Mode().Perm()|0o700); err != nil {
			os.RemoveAll(tmp)
			return "", err
		}
	}
	return tmp, nil
}

// replaceDir puts the complete folder tmp in place as dir. An existing dir (a checkpoint of the same step, or
// best/) is moved aside first, the new one renamed in, then the old one deleted, so no moment lacks a complete
// copy (CleanStale puts an aside copy back if a kill came between the two renames).
func replaceDir(tmp, dir string) error {
	if _, err := os.Stat(dir); err != nil {
		return os.Rename(tmp, dir)
	}
	aside, err := os.MkdirTemp(filepath.Dir(dir), "."+filepath.Base(dir)+".old-")
	if err != nil {
		return err
	}
	if err := os.Remove(aside); err != nil {
		return err
	}
	if err := os.Rename(dir, aside); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		_ = os.Rename(aside, dir)
		return err
	}
	return os.RemoveAll(aside)
}

// copyCheckpoint makes the checkpoint folder to a copy of the checkpoint folder from (best/ from the step's
// checkpoint), written like a checkpoint (a temporary folder, then replaceDir). Its files are hard links where
// the file system allows (a checkpoint's files are never changed in place, only replaced), copies otherwise.
func copyCheckpoint(from, to string) error {
	tmp, err := tempDir(to)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	err = filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, p)
		if err != nil || rel == "." {
			return err
		}
		dst := filepath.Join(tmp, rel)
		if d.IsDir() {
			return os.Mkdir(dst, 0o755)
		}
		if os.Link(p, dst) == nil {
			return nil
		}
		return copyFile(p, dst)
	})
	if err != nil {
		return err
	}
	return replaceDir(tmp, to)
}

// keptInitAdapter makes the copy of the init adapter in the checkpoint just saved at dir the source of the next
// checkpoint's.
func (t *Trainer) keptInitAdapter(dir string) {
	if t.initAdapter != nil {
		t.initAdapter = &initAdapterSource{dir: filepath.Join(dir, InitAdapterDir), ours: true, sums: t.initAdapter.sums}
	}
}

// fingerprint hashes the names and shapes of the model's parameters and, for the frozen ones, samples of their
// bytes (the first and last 4 KiB of each: enough to tell checkpoints apart without reading gigabytes).
func (t *Trainer) fingerprint() (string, error) {
	p := t.Model.Params()
	h := sha256.New()
	for _, n := range p.Names() {
		fmt.Fprintf(h, "%s%v;", n, p[n].Shape())
		if t.trainsBase(n) || p[n].Shape().Size() == 0 {
			continue
		}
		err := p[n].ConstBytes(func(b []byte) {
			const sample = 4096
			if len(b) <= 2*sample {
				h.Write(b)
				return
			}
			h.Write(b[:sample])
			h.Write(b[len(b)-sample:])
		})
		if err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// trainsBase reports whether base parameter name is trained (its bytes change during training, so the
// fingerprint leaves them out).
func (t *Trainer) trainsBase(name string) bool {
	_, ok := t.Train[name]
	return ok
}

// Resume continues a run from the checkpoint folder dir (or an output folder, whose latest checkpoint is used,
// or its best/ when it has no latest: ResumeCheckpoint): model must be the same base model, loaded with the same options, and data the same dataset (its
// position is restored). The trainer's config is the saved one. A run of custom adapters (method custom) is
// resumed with the same adapters, built as for New and passed as WithAdapters: their type and settings must be
// the saved ones, and their trained tensors are replaced by the checkpoint's.
func Resume(dir string, model Model, backend compute.Backend, data Iterator, opts ...Option) (*Trainer, error) {
	dir, _, err := ResumeCheckpoint(dir)
	if err != nil {
		return nil, err
	}
	raw, err := readfile.Read(filepath.Join(dir, StateFile), readfile.Config)
	if err != nil {
		return nil, err
	}
	var s savedState
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, StateFile), err)
	}
	if s.Version != 1 {
		return nil, fmt.Errorf("%s: unknown checkpoint version %d", dir, s.Version)
	}
	for _, f := range []string{TrainableFile, OptimizerFile} {
		if _, ok := s.Checksums[f]; !ok {
			return nil, fmt.Errorf("%w: %s has no checksum of %s (memfit writes one with every checkpoint), so its bytes cannot be checked: resume from another checkpoint, or start the run again with --overwrite",
				ErrCorruptCheckpoint, filepath.Join(dir, StateFile), f)
		}
	}
	for _, f := range sortedKeys(s.Checksums) {
		got, err := fileSHA256(filepath.Join(dir, f))
		if err != nil {
			return nil, err
		}
		if got != s.Checksums[f] {
			return nil, fmt.Errorf("%w: %s does not match the checksum written with it (its bytes changed since the save): resume from an earlier checkpoint", ErrCorruptCheckpoint, filepath.Join(dir, f))
		}
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if s.Config.Method == MethodCustom && o.adapters == nil {
		return nil, fmt.Errorf("%s trained custom adapters (%v): resume it with the same adapters (finetune.WithAdapters)", dir, s.Adapter[adapter.KeyType])
	}
	if s.Config.InitAdapter != "" {
		// The run's own copy of its init adapter; checkpoints written before memfit kept one read the folder.
		if _, err := os.Stat(filepath.Join(dir, InitAdapterDir, AdapterConfig)); err == nil {
			opts = append(slices.Clone(opts), func(o *options) { o.initFrom = filepath.Join(dir, InitAdapterDir) })
		} else {
			opts = append(slices.Clone(opts), func(o *options) { o.legacyInit = true })
		}
	}
	t, err := New(model, s.Config, backend, opts...)
	if err != nil {
		return nil, err
	}
	if ac, err := t.adapterConfig(); err != nil {
		return nil, err
	} else if s.Adapter != nil && fmt.Sprint(withoutUnset(ac)) != fmt.Sprint(withoutUnset(s.Adapter)) {
		return nil, fmt.Errorf("%s was trained with adapters %v, not %v", dir, s.Adapter, ac)
	}
	fp, err := t.fingerprint()
	if err != nil {
		return nil, err
	}
	if fp != s.ModelFingerprint {
		return nil, fmt.Errorf("%s was trained from a different base model (or other model options)", dir)
	}
	train, err := readAll(filepath.Join(dir, TrainableFile))
	if err != nil {
		return nil, err
	}
	if err := sameNames(t.Train, train, "trainable tensors"); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	opt, err := readAll(filepath.Join(dir, OptimizerFile))
	if err != nil {
		return nil, err
	}
	m, v := models.Params{}, models.Params{}
	var mesa []*tensors.Tensor
	for i := 0; ; i++ {
		x, ok := opt[fmt.Sprintf("mesa.%d", i)]
		if !ok {
			break
		}
		mesa = append(mesa, x)
		delete(opt, fmt.Sprintf("mesa.%d", i))
	}
	for n, x := range opt {
		switch {
		case len(n) > 2 && n[:2] == "m.":
			m[n[2:]] = x
		case len(n) > 2 && n[:2] == "v.":
			v[n[2:]] = x
		default:
			return nil, fmt.Errorf("%s: unexpected optimizer tensor %q", dir, n)
		}
	}
	if err := sameNames(t.M, m, "optimizer moments"); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	if err := sameNames(t.V, v, "optimizer second moments"); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	t.Train, t.M, t.V, t.Step, t.Mesa = train, m, v, s.Step, mesa
	if s.Eval != nil {
		t.EvalState = *s.Eval
	}
	t.resumedEval, t.resumedFrom = s.EvalData, dir
	if len(s.RNG) != t.RNG.Shape().Size() {
		return nil, fmt.Errorf("%s: the random-number state has %d words, want %d", dir, len(s.RNG), t.RNG.Shape().Size())
	}
	t.RNG = tensors.FromFlatDataAndDimensions(append([]uint64(nil), s.RNG...), t.RNG.Shape().Dimensions...)
	if data != nil && len(s.Data) > 0 {
		if err := data.Restore(s.Data); err != nil {
			return nil, fmt.Errorf("%s: %w", dir, err)
		}
	}
	return t, nil
}

// withoutUnset returns c without its keys whose values are empty objects (rank_pattern and alpha_pattern: a
// checkpoint written before memfit wrote them has none).
func withoutUnset(c map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range c {
		if m, ok := v.(map[string]any); ok && len(m) == 0 {
			continue
		}
		out[k] = v
	}
	return out
}

func readAll(path string) (models.Params, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := models.Params{}
	for _, n := range f.Names() {
		if out[n], err = f.TensorAs(n, dtypes.Float32); err != nil {
			return nil, err
		}
		if err := models.CheckFinite(out[n], n); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return out, nil
}

func sameNames(want, got models.Params, what string) error {
	wn, gn := want.Names(), got.Names()
	sort.Strings(wn)
	sort.Strings(gn)
	if len(wn) != len(gn) {
		return fmt.Errorf("the checkpoint has %d %s, the run expects %d", len(gn), what, len(wn))
	}
	for i := range wn {
		if wn[i] != gn[i] {
			return fmt.Errorf("%s: the checkpoint has %q where the run expects %q", what, gn[i], wn[i])
		}
		if !sameDims(want[wn[i]].Shape().Dimensions, got[gn[i]].Shape().Dimensions) {
			return fmt.Errorf("%s: %q has shape %v, the run expects %v", what, wn[i], got[gn[i]].Shape(), want[wn[i]].Shape())
		}
	}
	return nil
}

func sameDims(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
