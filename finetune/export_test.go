package finetune_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/family/lm"
	vitfam "github.com/memfit/memfit/family/vit"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/models/vit"
	"github.com/memfit/memfit/safetensors"
)

// randomNorms gives the norms non-trivial weights and biases so folding matters.
func randomNorms(p models.Params) {
	for name, t := range p {
		if strings.Contains(name, "norm") || strings.Contains(name, "layernorm") {
			v := gtest.Rand(uint64(len(name)*7), t.Shape().Size(), 0.2)
			if strings.HasSuffix(name, "weight") {
				for i := range v {
					v[i]++
				}
			}
			p[name] = tensors.FromFlatDataAndDimensions(v, t.Shape().Dimensions...)
		}
	}
}

// TestExportRoundTrip: after LoRA training with MS-norm (folded base), (1) the exported PEFT adapter imported
// into the plain model, (2) the merged checkpoint loaded as a plain model, both give the trained model's logits;
// and the adapter files have PEFT's keys and config.
func TestExportRoundTrip(t *testing.T) {
	type arch struct {
		name    string
		model   func(ms bool) finetune.Model
		plain   func(dir string) (finetune.Model, error)
		data    finetune.Examples
		modules []string
	}
	vcfg, _ := vit.Preset("tiny", 3)
	vparams := vit.RandomParams(vcfg, 11)
	randomNorms(vparams)
	lcfg, _ := llama.Preset("tiny", 0)
	lparams := decoder.RandomParams(lcfg, 12)
	randomNorms(lparams)
	_, images := imageTask(t, vit.Options{})
	_, text := textTask(t, decoder.Options{})
	archs := []arch{
		{"vit", func(ms bool) finetune.Model {
			m, err := vit.New(vcfg, vparams, vit.Options{MSNorm: ms, ApproxActivation: ms})
			if err != nil {
				t.Fatal(err)
			}
			return vitfam.Model{Model: m}
		}, func(dir string) (finetune.Model, error) {
			m, err := vit.Load(dir, vit.Options{})
			return vitfam.Model{Model: m}, err
		}, images, []string{"classifier"}},
		{"llama", func(ms bool) finetune.Model {
			m, err := decoder.New(lcfg, lparams, decoder.Options{MSNorm: ms, ApproxActivation: ms})
			if err != nil {
				t.Fatal(err)
			}
			return lm.Model{Model: m, Spec: llama.Spec}
		}, func(dir string) (finetune.Model, error) {
			m, err := llama.Load(dir, decoder.Options{})
			return lm.Model{Model: m, Spec: llama.Spec}, err
		}, text, []string{"lm_head"}},
	}
	for _, a := range archs {
		t.Run(a.name, func(t *testing.T) {
			cfg := config(finetune.MethodLoRA, 5)
			cfg.LoRATarget = []string{"all-linear"}
			cfg.TrainModules = a.modules
			model := a.model(true)
			tr, err := finetune.New(model, cfg, gtest.Backend(t))
			if err != nil {
				t.Fatal(err)
			}
			loader, _ := finetune.NewLoader(a.data, 4, 3, true)
			if err := tr.Fit(context.Background(), loader, "", nil, finetune.Hooks{}); err != nil {
				t.Fatal(err)
			}
			batch, _ := loader.Next()
			delete(batch, "labels")
			want, err := tr.Logits(batch)
			if err != nil {
				t.Fatal(err)
			}
			wantV := gtest.Float32s(want)

			// PEFT adapter into the plain (unfolded) model.
			adir := filepath.Join(t.TempDir(), "adapter")
			if err := tr.ExportAdapter(adir, "memfit/"+a.name+"-tiny"); err != nil {
				t.Fatal(err)
			}
			plain := a.model(false)
			imported, err := finetune.ReadAdapter(adir, plain)
			if err != nil {
				t.Fatal(err)
			}
			set := imported.Set
			params := models.Params{}
			for n, v := range plain.Params() {
				params[n] = v
			}
			for n, v := range imported.Modules {
				params[n] = v
			}
			got, err := finetune.Logits(gtest.Backend(t), plain, params, set, batch)
			if err != nil {
				t.Fatal(err)
			}
			if d := gtest.MaxRelDiff(gtest.Float32s(got), wantV, 1); d > 1e-4 {
				t.Errorf("exported adapter on the plain model: logits differ by %g", d)
			}
			checkPEFTFiles(t, adir, a.modules)

			// Merged checkpoint loaded by the stock model code.
			mdir := filepath.Join(t.TempDir(), "merged")
			if err := tr.ExportMerged(mdir); err != nil {
				t.Fatal(err)
			}
			merged, err := a.plain(mdir)
			if err != nil {
				t.Fatal(err)
			}
			got, err = finetune.Logits(gtest.Backend(t), merged, nil, nil, batch)
			if err != nil {
				t.Fatal(err)
			}
			if d := gtest.MaxRelDiff(gtest.Float32s(got), wantV, 1); d > 1e-4 {
				t.Errorf("merged checkpoint: logits differ by %g", d)
			}
		})
	}
}

func checkPEFTFiles(t *testing.T, dir string, modules []string) {
	t.Helper()
	f, err := safetensors.Open(filepath.Join(dir, finetune.AdapterWeights))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var aKeys, bKeys int
	for _, k := range f.Names() {
		if !strings.HasPrefix(k, "base_model.model.") {
			t.Errorf("key %q lacks the base_model.model. prefix", k)
		}
		switch {
		case strings.HasSuffix(k, ".lora_A.weight"):
			aKeys++
		case strings.HasSuffix(k, ".lora_B.weight"):
			bKeys++
		}
	}
	if aKeys == 0 || aKeys != bKeys {
		t.Errorf("%d lora_A and %d lora_B keys", aKeys, bKeys)
	}
	if f.Metadata()["format"] != "pt" {
		t.Errorf("metadata %v", f.Metadata())
	}
	raw, _ := os.ReadFile(filepath.Join(dir, finetune.AdapterConfig))
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"peft_type", "r", "lora_alpha", "target_modules", "base_model_name_or_path", "task_type", "bias"} {
		if _, ok := cfg[key]; !ok {
			t.Errorf("adapter_config.json lacks %q", key)
		}
	}
	if cfg["peft_type"] != "LORA" || cfg["bias"] != "none" {
		t.Errorf("config %v", cfg)
	}
	if ms, _ := cfg["modules_to_save"].([]any); len(ms) != len(modules) {
		t.Errorf("modules_to_save %v, want %v", cfg["modules_to_save"], modules)
	}
}

// TestInitAdapterContinues: training can start from an exported PEFT adapter (and its modules_to_save): the
// logits at the start equal those at the end of the first run.
func TestInitAdapterContinues(t *testing.T) {
	model, data := imageTask(t, vit.Options{MSNorm: true})
	cfg := config(finetune.MethodLoRA, 4)
	cfg.LoRARank = 4
	cfg.TrainModules = []string{"classifier"}
	tr, _ := finetune.New(model, cfg, gtest.Backend(t))
	loader, _ := finetune.NewLoader(data, 6, 1, true)
	if err := tr.Fit(context.Background(), loader, "", nil, finetune.Hooks{}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "adapter")
	if err := tr.ExportAdapter(dir, "x"); err != nil {
		t.Fatal(err)
	}
	batch, _ := loader.Next()
	delete(batch, "labels")
	want, _ := tr.Logits(batch)
	cfg2 := cfg
	cfg2.InitAdapter, cfg2.LoRATarget = dir, nil
	tr2, err := finetune.New(model, cfg2, gtest.Backend(t))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := tr2.Logits(batch)
	if d := gtest.MaxAbsDiff(gtest.Float32s(got), gtest.Float32s(want)); d > 1e-5 {
		t.Errorf("continued run starts %g away from the exported adapter", d)
	}
	cfg2.LoRARank = 8
	if _, err := finetune.New(model, cfg2, gtest.Backend(t)); err == nil || !strings.Contains(err.Error(), "r=4") {
		t.Errorf("rank mismatch: %v", err)
	}
}

// TestReadAdapterRefusesWhatItCannotPlace: an adapter_config.json no registered format reads, and a tensor that
// belongs to no linear layer and is no model parameter, are refused with their names; an unknown setting of a
// known format is refused by its key.
func TestReadAdapterRefusesWhatItCannotPlace(t *testing.T) {
	model, _ := imageTask(t, vit.Options{})
	tr, err := finetune.New(model, config(finetune.MethodLoRA, 1), gtest.Backend(t))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "adapter")
	if err := tr.ExportAdapter(dir, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := finetune.ReadAdapter(dir, model); err != nil {
		t.Fatalf("the exported adapter does not read back: %v", err)
	}
	cfgPath := filepath.Join(dir, finetune.AdapterConfig)
	raw, _ := os.ReadFile(cfgPath)
	edit := func(key string, value any) {
		c := map[string]any{}
		if err := json.Unmarshal(raw, &c); err != nil {
			t.Fatal(err)
		}
		c[key] = value
		b, _ := json.Marshal(c)
		if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	edit("peft_type", "PROMPT_TUNING")
	if _, err := finetune.ReadAdapter(dir, model); err == nil || !strings.Contains(err.Error(), `"PROMPT_TUNING"`) || !strings.Contains(err.Error(), "adapter.Register") {
		t.Errorf("unknown peft_type: %v", err)
	}
	edit("fan_in_fan_out", true)
	if _, err := finetune.ReadAdapter(dir, model); err == nil || !strings.Contains(err.Error(), "fan_in_fan_out") {
		t.Errorf("fan_in_fan_out: %v", err)
	}
	edit("r", 3)
	if _, err := finetune.ReadAdapter(dir, model); err == nil || !strings.Contains(err.Error(), "adapter_config.json implies [3") {
		t.Errorf("rank that does not match the tensors: %v", err)
	}
	edit("peft_type", "LORA") // restores the other keys too
	weights := filepath.Join(dir, finetune.AdapterWeights)
	f, err := safetensors.Open(weights)
	if err != nil {
		t.Fatal(err)
	}
	all := map[string]*tensors.Tensor{}
	for _, n := range f.Names() {
		if all[n], err = f.Tensor(n); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	all["base_model.model.vit.pooler.dense.lora_A.weight"] = gtest.Tensor(make([]float32, 4), 2, 2)
	if err := safetensors.WriteTensors(weights, all, "", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := finetune.ReadAdapter(dir, model); err == nil || !strings.Contains(err.Error(), "vit.pooler.dense.lora_A.weight") {
		t.Errorf("a tensor of no layer: %v", err)
	}
}

// TestInitAdapterKeptInCheckpoints: a run from an init_adapter keeps a copy of it in every checkpoint and
// resumes from that copy once the folder is gone; a folder changed between the start and a checkpoint is
// refused rather than copied.
func TestInitAdapterKeptInCheckpoints(t *testing.T) {
	model, data := imageTask(t, vit.Options{})
	cfg := config(finetune.MethodLoRA, 2)
	cfg.LoRARank = 4
	tr, _ := finetune.New(model, cfg, gtest.Backend(t))
	loader, _ := finetune.NewLoader(data, 6, 1, true)
	if err := tr.Fit(context.Background(), loader, "", nil, finetune.Hooks{}); err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	dir := filepath.Join(tmp, "adapter")
	if err := tr.ExportAdapter(dir, "x"); err != nil {
		t.Fatal(err)
	}
	cfg2 := cfg
	cfg2.Method, cfg2.InitAdapter, cfg2.LoRATarget, cfg2.CheckpointEvery = finetune.MethodLoRAFA, dir, nil, 1
	weights := filepath.Join(dir, finetune.AdapterWeights)
	orig, _ := os.ReadFile(weights)

	changed, err := finetune.New(model, cfg2, gtest.Backend(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(weights, append(append([]byte(nil), orig...), ' '), 0o644); err != nil {
		t.Fatal(err)
	}
	loader, _ = finetune.NewLoader(data, 6, 1, true)
	if err := changed.Fit(context.Background(), loader, filepath.Join(tmp, "changed"), nil, finetune.Hooks{}); err == nil || !strings.Contains(err.Error(), "changed since the run read it") {
		t.Errorf("an init adapter changed before the checkpoint: %v", err)
	}
	os.WriteFile(weights, orig, 0o644)

	out := filepath.Join(tmp, "run")
	tr2, err := finetune.New(model, cfg2, gtest.Backend(t))
	if err != nil {
		t.Fatal(err)
	}
	loader, _ = finetune.NewLoader(data, 6, 1, true)
	if err := tr2.Fit(context.Background(), loader, out, nil, finetune.Hooks{}); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	resumed, err := finetune.Resume(out, model, gtest.Backend(t), nil)
	if err != nil {
		t.Fatalf("resume without the init adapter's folder: %v", err)
	}
	if resumed.Config.InitAdapter != dir || resumed.Step != 2 {
		t.Errorf("resumed config init_adapter %q, step %d", resumed.Config.InitAdapter, resumed.Step)
	}
	for name := range tr.Adapters.Params {
		if strings.HasSuffix(name, "lora_A.weight") && !tensorsEqual(t, resumed.Adapters.Params[name], tr.Train[name]) {
			t.Errorf("%s: the resumed run's frozen A is not the init adapter's", name)
		}
	}
	if err := resumed.ExportAdapter(filepath.Join(tmp, "export"), "x"); err != nil {
		t.Errorf("export after the init adapter's folder is gone: %v", err)
	}

	// A checkpoint written before runs kept their init adapter (no copy, the default lora_targets the run
	// ignored) still resumes from the adapter's folder.
	os.MkdirAll(dir, 0o755)
	for _, f := range []string{finetune.AdapterConfig, finetune.AdapterWeights} {
		b, _ := os.ReadFile(filepath.Join(out, "checkpoint-2", "init-adapter", f))
		os.WriteFile(filepath.Join(dir, f), b, 0o644)
	}
	ckpt := filepath.Join(out, "checkpoint-2")
	os.RemoveAll(filepath.Join(ckpt, "init-adapter"))
	state := map[string]any{}
	raw, _ := os.ReadFile(filepath.Join(ckpt, finetune.StateFile))
	if err := json.Unmarshal(raw, &state); err != nil {
		t.Fatal(err)
	}
	sums := state["checksums"].(map[string]any)
	for k := range sums {
		if strings.HasPrefix(k, "init-adapter") {
			delete(sums, k)
		}
	}
	state["config"].(map[string]any)["lora_targets"] = []string{"k"} // not the adapter's q, v
	raw, _ = json.Marshal(state)
	os.WriteFile(filepath.Join(ckpt, finetune.StateFile), raw, 0o644)
	if _, err := finetune.Resume(ckpt, model, gtest.Backend(t), nil); err != nil {
		t.Errorf("a checkpoint without the init adapter's copy: %v", err)
	}
}
