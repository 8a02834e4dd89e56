package cli_test

import (
	"bufio"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/tokenizer"
)

// The independent check of preference tuning: after a few DPO (ORPO) steps on llama-tiny with LoRA, the
// validation loss and metrics memfit writes to metrics.jsonl equal those computed here, in plain float64 Go, with
// TRL's formulas (DPOTrainer.dpo_loss and get_batch_loss_metrics; ORPOTrainer.odds_ratio_loss and
// get_batch_loss_metrics), from the logits `finetune logits` prints for the policy (the base model with the
// exported adapter) and for the reference (the base model alone), on the pairs tokenized as TRL does (the
// prompt with BOS, each completion on its own followed by EOS). None of memfit's loss code runs here.

// checkPair is a preference pair of the check, as text.
type checkPair struct{ Prompt, Chosen, Rejected string }

// checkPairs returns n + m pairs from alpaca-libre v1 with short responses: an Alpaca-style prompt, the row's
// response as chosen and the response of the row three further on as rejected.
func checkPairs(t *testing.T, n int) []checkPair {
	t.Helper()
	f, err := os.Open(filepath.Join(golden.SharedDir(t), "alpaca-libre", "alpaca_libre_tasks_v1.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type row struct{ Instruction, Input, Output, Status string }
	var rows []row
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() && len(rows) < n+3 {
		var r row
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		if r.Status == "ok" && r.Input == "" && len(r.Output) > 10 && len(r.Output) < 120 && len(r.Instruction) < 80 {
			rows = append(rows, r)
		}
	}
	var out []checkPair
	for i := 0; i < n; i++ {
		out = append(out, checkPair{Prompt: "### Instruction:\n" + rows[i].Instruction + "\n\n### Response:\n",
			Chosen: rows[i].Output, Rejected: rows[i+3].Output})
	}
	return out
}

func writePairs(t *testing.T, path string, pairs []checkPair) {
	t.Helper()
	var sb strings.Builder
	for _, p := range pairs {
		b, err := json.Marshal(map[string]string{"prompt": p.Prompt, "chosen": p.Chosen, "rejected": p.Rejected})
		if err != nil {
			t.Fatal(err)
		}
		sb.Write(append(b, '\n'))
	}
	if err := os.WriteFile(path, []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// sequenceLogits runs `finetune logits` (with the adapter when not "") on the sequences, padded on the right with an
// attention mask, and returns each sequence's logits [T][vocab] (its real positions only).
func sequenceLogits(t *testing.T, model, adapter string, seqs [][]int) [][][]float64 {
	t.Helper()
	longest := 0
	for _, s := range seqs {
		longest = max(longest, len(s))
	}
	ids, mask := make([][]int, len(seqs)), make([][]int, len(seqs))
	for i, s := range seqs {
		ids[i], mask[i] = make([]int, longest), make([]int, longest)
		copy(ids[i], s)
		for j := range s {
			mask[i][j] = 1
		}
	}
	in := filepath.Join(t.TempDir(), "inputs.json")
	b, _ := json.Marshal(map[string]any{"input_ids": ids, "attention_mask": mask})
	if err := os.WriteFile(in, b, 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"logits", "--model", model, "--inputs", in}
	if adapter != "" {
		args = append(args, "--adapter", adapter)
	}
	stdout, stderr, code := run(t, args...)
	if code != 0 {
		t.Fatalf("logits exit %d: %s", code, stderr)
	}
	var out struct{ Logits [][][]float64 }
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatal(err)
	}
	for i, s := range seqs {
		out.Logits[i] = out.Logits[i][:len(s)]
	}
	return out.Logits
}

// tokenLogProbs returns, for each position t >= 1 of seq, log softmax(logits[t-1])[seq[t]].
func tokenLogProbs(logits [][]float64, seq []int) []float64 {
	out := make([]float64, len(seq))
	for t := 1; t < len(seq); t++ {
		row := logits[t-1]
		m := math.Inf(-1)
		for _, v := range row {
			m = math.Max(m, v)
		}
		s := 0.0
		for _, v := range row {
			s += math.Exp(v - m)
		}
		out[t] = row[seq[t]] - m - math.Log(s)
	}
	return out
}

func logSigmoid(x float64) float64 {
	if x < 0 {
		return x - math.Log1p(math.Exp(x))
	}
	return -math.Log1p(math.Exp(-x))
}

func TestPreferenceMatchesTRLFromLogits(t *testing.T) {
	model := filepath.Join("..", "pretrained", "llama-tiny")
	pairs := checkPairs(t, 12)
	train, eval := pairs[:8], pairs[8:]
	tok, err := tokenizer.Load(model)
	if err != nil {
		t.Fatal(err)
	}
	bos, _ := tok.BOS()
	eos, _ := tok.EOS()
	// TRL's tokenization: the prompt with the special tokens, each completion alone, then EOS.
	var seqs [][]int
	var promptLen []int
	for _, p := range eval {
		prompt := tok.Encode(p.Prompt, true)
		if prompt[0] != bos {
			t.Fatalf("the prompt does not start with BOS: %v", prompt[:3])
		}
		for _, c := range []string{p.Chosen, p.Rejected} {
			seqs = append(seqs, append(append(append([]int(nil), prompt...), tok.Encode(c, false)...), eos))
			promptLen = append(promptLen, len(prompt))
			if len(seqs[len(seqs)-1]) > 96 {
				t.Fatalf("a check sequence is %d tokens, more than --seq-len 96: it would be cut", len(seqs[len(seqs)-1]))
			}
		}
	}
	tmp := t.TempDir()
	trainPath, evalPath := filepath.Join(tmp, "train.jsonl"), filepath.Join(tmp, "eval.jsonl")
	writePairs(t, trainPath, train)
	writePairs(t, evalPath, eval)
	ref := sequenceLogits(t, model, "", seqs)
	for _, objective := range []string{"dpo", "orpo"} {
		t.Run(objective, func(t *testing.T) {
			out := filepath.Join(tmp, objective)
			_, stderr, code := run(t, "train", "--model", model, "--data", trainPath, "--eval-data", evalPath, "--objective", objective,
				"--lora-targets", "all-linear", "--steps", "3", "--batch-size", "4", "--lr", "0.01", "--seq-len", "96", "--out", out)
			if code != 0 {
				t.Fatalf("train exit %d: %s", code, stderr)
			}
			var last map[string]any
			for _, l := range readMetrics(t, filepath.Join(out, "metrics.jsonl")) {
				if l["kind"] == "eval" {
					last = l
				}
			}
			if last == nil || last["step"].(float64) != 3 {
				t.Fatalf("no validation record at step 3: %v", last)
			}
			policy := sequenceLogits(t, model, filepath.Join(out, "adapter"), seqs)
			want := map[string]float64{}
			n := float64(len(eval))
			var nllSum, nllCount float64
			for i := range eval {
				var pol, rf [2]float64 // chosen, rejected: summed (DPO) or mean (ORPO) completion log-likelihoods
				for k := 0; k < 2; k++ {
					s := 2*i + k
					lp, lr := tokenLogProbs(policy[s], seqs[s]), tokenLogProbs(ref[s], seqs[s])
					count := 0.0
					for t := promptLen[s]; t < len(seqs[s]); t++ {
						pol[k] += lp[t]
						rf[k] += lr[t]
						count++
					}
					if objective == "orpo" {
						pol[k] /= count
						if k == 0 { // ORPO's NLL: every real token of prompt + chosen after the first
							for t := 1; t < len(seqs[s]); t++ {
								nllSum -= lp[t]
								nllCount++
							}
						}
					}
				}
				var wc, wr float64
				switch objective {
				case "dpo":
					const beta = 0.1 // --dpo-beta's default
					z := (pol[0] - pol[1]) - (rf[0] - rf[1])
					want["eval_loss"] += -logSigmoid(beta*z) / n
					wc, wr = beta*(pol[0]-rf[0]), beta*(pol[1]-rf[1])
				case "orpo":
					const lambda = 0.1 // --orpo-lambda's default
					log1mexp := func(x float64) float64 { return math.Log(-math.Expm1(x)) }
					logOdds := (pol[0] - pol[1]) - (log1mexp(pol[0]) - log1mexp(pol[1]))
					want["eval_loss"] += -lambda * logSigmoid(logOdds) / n
					want["eval_log_odds_ratio"] += logSigmoid(logOdds) / n
					want["eval_log_odds_chosen"] += logOdds / n
					wc, wr = lambda*pol[0], lambda*pol[1]
				}
				want["eval_rewards/chosen"] += wc / n
				want["eval_rewards/rejected"] += wr / n
				want["eval_rewards/margins"] += (wc - wr) / n
				if wc > wr {
					want["eval_rewards/accuracies"] += 1 / n
				}
				want["eval_logps/chosen"] += pol[0] / n
				want["eval_logps/rejected"] += pol[1] / n
			}
			if objective == "orpo" {
				// TRL's ORPO NLL is the mean over the whole batch's tokens; memfit's validation weights each batch
				// by its pairs: with one batch of all the pairs (4 <= --batch-size) the two agree.
				want["eval_nll_loss"] = nllSum / nllCount
				want["eval_loss"] += want["eval_nll_loss"]
			}
			for key, w := range want {
				got, ok := last[key].(float64)
				if !ok {
					t.Errorf("metrics.jsonl's validation record has no %s: %v", key, last)
					continue
				}
				if math.Abs(got-w) > 1e-4*math.Max(1, math.Abs(w)) {
					t.Errorf("%s: memfit %.7g, from the logits %.7g", key, got, w)
				}
			}
			if want["eval_rewards/margins"] == 0 {
				t.Errorf("the policy did not move from the reference: %v", want)
			}
			t.Logf("%s from the logits: %v", objective, want)
		})
	}
}

// TestPreferenceBadInput: the preference settings and data are refused in one line, exit 2, before anything is
// written, when they do not go together.
func TestPreferenceBadInput(t *testing.T) {
	model := filepath.Join("..", "pretrained", "llama-tiny")
	tmp := t.TempDir()
	pairs := filepath.Join(tmp, "pairs.jsonl")
	writePairs(t, pairs, checkPairs(t, 4))
	alpaca := filepath.Join(tmp, "alpaca.jsonl")
	if err := os.WriteFile(alpaca, []byte(`{"instruction": "Say hi.", "input": "", "output": "Hi."}`+"\n"+`{"instruction": "Say bye.", "input": "", "output": "Bye."}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	train := func(args ...string) []string {
		return append([]string{"train", "--model", model, "--out", filepath.Join(tmp, "run"), "--steps", "1", "--batch-size", "2", "--seq-len", "96"}, args...)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{train("--data", alpaca, "--objective", "dpo"), "objective dpo trains on preference pairs"},
		{train("--data", pairs), "train on them with --objective dpo or --objective orpo"},
		{train("--data", pairs, "--objective", "kto"), "objective must be dpo or orpo"},
		{train("--data", pairs, "--dpo-beta", "0.2"), "go with objective dpo or orpo"},
		{train("--data", pairs, "--objective", "orpo", "--precompute-ref"), "ORPO has no reference model"},
		{train("--data", pairs, "--objective", "dpo", "--dpo-loss", "ipo", "--dpo-label-smoothing", "0.1"), "applies to the sigmoid loss"},
		{train("--data", pairs, "--objective", "dpo", "--dpo-beta", "0"), "dpo_beta must be positive"},
		{train("--data", alpaca, "--max-prompt-len", "16"), "--max-prompt-len cuts the prompts of preference pairs"},
		{train("--data", pairs, "--objective", "dpo", "--seq-len", "8"), "no pair keeps a completion token within --seq-len 8"},
	} {
		_, stderr, code := run(t, tc.args...)
		if code == 0 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want one line saying %q", tc.args[5:], code, stderr, tc.want)
		}
		if _, err := os.Stat(filepath.Join(tmp, "run")); err == nil {
			t.Fatalf("%v: the refused run left its folder behind", tc.args[5:])
		}
	}
}

// TestPreferenceResumeIsExact: a DPO run with precomputed reference log-likelihoods, stopped after 2 steps and
// resumed to 4, writes the metrics of a straight 4-step run (the cached log-likelihoods read back, the data
// position and the validation state restored); memory --objective dpo plans the pair step.
func TestPreferenceResumeIsExact(t *testing.T) {
	model := filepath.Join("..", "pretrained", "llama-tiny")
	tmp := t.TempDir()
	pairs := filepath.Join(tmp, "pairs.jsonl")
	writePairs(t, pairs, checkPairs(t, 10))
	args := func(out, steps string) []string {
		return []string{"train", "--model", model, "--data", pairs, "--objective", "dpo", "--precompute-ref", "--eval-split", "0.2",
			"--eval-every", "2", "--lora-targets", "all-linear", "--batch-size", "4", "--lr", "0.003", "--seq-len", "96",
			"--log-every", "1", "--steps", steps, "--out", out}
	}
	straight, split := filepath.Join(tmp, "straight"), filepath.Join(tmp, "split")
	for _, a := range [][]string{args(straight, "4"), args(split, "2"), {"train", "--out", split, "--resume", "--steps", "4"}} {
		if _, stderr, code := run(t, a...); code != 0 {
			t.Fatalf("%v: exit %d: %s", a, code, stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(split, "reference-logps.safetensors")); err != nil {
		t.Fatal(err)
	}
	strip := func(lines []map[string]any) string {
		for _, l := range lines {
			for k := range l {
				if strings.Contains(k, "second") {
					delete(l, k)
				}
			}
		}
		b, _ := json.Marshal(lines)
		return string(b)
	}
	a, b := strip(readMetrics(t, filepath.Join(straight, "metrics.jsonl"))), strip(readMetrics(t, filepath.Join(split, "metrics.jsonl")))
	if a != b || !strings.Contains(a, `"eval_rewards/accuracies"`) || !strings.Contains(a, `"rewards/margins"`) {
		t.Errorf("resumed metrics differ from the straight run's:\n%s\n%s", a, b)
	}
	stdout, stderr, code := run(t, "memory", "--model", "llama:tiny", "--objective", "dpo", "--lora-targets", "all-linear",
		"--batch-size", "2", "--seq-len", "32", "--variants", "plain,approx-act+ms-norm")
	if code != 0 || !strings.Contains(stdout, "objective dpo") || !strings.Contains(stdout, "batch 2 pairs (chosen + rejected: 4 sequences)") {
		t.Errorf("memory --objective dpo: exit %d\n%s%s", code, stdout, stderr)
	}
}
