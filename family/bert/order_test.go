package bert_test

import (
	"testing"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/internal/ordertest"
)

// TestOrderIsData: in every memory mode, the encoder's training steps order their savings by data dependences
// (memory.CheckOrder) on the graph XLA would get and on the pure-Go backend's, and the ties change nothing on the
// pure-Go backend (saved activations, simulated peak, results).
func TestOrderIsData(t *testing.T) {
	base := finetune.Defaults()
	base.LoRATarget, base.BatchSize = []string{"all-linear"}, 4
	shape := finetune.Shape{Batch: 4, Seq: 32} // activations above a quarter of the embedding table (ordertest.MinBytes)
	ordertest.Family(t, gtest.Backend(t), "roberta-mini", 2, base, shape)
	ordertest.GoUnchanged(t, gtest.Backend(t), "roberta-mini", 2, base, shape)
}
