package models_test

import (
	"strings"
	"testing"

	"github.com/memfit/memfit/models"
)

// TestBlockPlanSyntax: plans read into per-block modes and write back in their shortest form; bad plans are
// refused naming the entry.
func TestBlockPlanSyntax(t *testing.T) {
	modes, err := models.ParseBlockPlan(" grad-ckpt*2, approx-act+mesa-softmax+mesa-act ,plain*2", 5)
	if err != nil {
		t.Fatal(err)
	}
	if !modes[0].GradCheckpoint || !modes[1].GradCheckpoint || !modes[2].ApproxActivation || modes[3].ApproxActivation {
		t.Fatalf("modes %v", modes)
	}
	if got := strings.Join(modes[2].Mesa, ","); got != "act,softmax" {
		t.Errorf("mesa kinds %q, want act,softmax (sorted)", got)
	}
	if got, want := models.FormatBlockPlan(modes), "grad-ckpt*2,approx-act+mesa-act+mesa-softmax,plain*2"; got != want {
		t.Errorf("FormatBlockPlan = %q, want %q", got, want)
	}
	if again, err := models.ParseBlockPlan(models.FormatBlockPlan(modes), 5); err != nil || models.FormatBlockPlan(again) != models.FormatBlockPlan(modes) {
		t.Errorf("the written plan does not read back: %v", err)
	}
	if m, _ := models.ParseBlockPlan("", 5); m != nil {
		t.Error("an empty plan must be nil (the model-wide options)")
	}
	for plan, want := range map[string]string{
		"plain*4":              "covers 4 blocks, the model has 5",
		"plain*6":              "covers 6 blocks, the model has 5",
		"plain*0,plain*5":      "positive number",
		"fast*5":               `unknown option "fast"`,
		"mesa-weights*5":       "unknown Mesa kind",
		"grad-ckpt+mesa-act*5": "mesa has nothing to store",
		",plain*5":             "empty mode",
	} {
		if _, err := models.ParseBlockPlan(plan, 5); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", plan, err, want)
		}
	}
}
