package bert

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/encoder"
)

// NewHead returns the config.json and parameters of the encoder m (loaded unfolded) as a sequence classifier of
// the given classes (one: a regression head), as transformers builds ...ForSequenceClassification from a
// pretrained checkpoint: the encoder's weights kept, the masked-LM head dropped, the classification head new
// (RoBERTa's classifier.dense and out_proj, BERT's classifier; weights normal(0, 0.02), biases zero, drawn from
// seed); BERT keeps a pooler the checkpoint has and draws one it lacks.
func NewHead(model finetune.Model, labels []string, seed uint64) ([]byte, models.Params, error) {
	m, ok := model.(Encoder)
	if !ok {
		return nil, nil, fmt.Errorf("model %T is not an encoder", model)
	}
	if m.Options.MSNorm {
		return nil, nil, fmt.Errorf("a new head is made from the unfolded model (load it without ms_norm)")
	}
	if len(labels) == 0 {
		return nil, nil, fmt.Errorf("a classifier needs at least one label")
	}
	c := m.Config
	c.Head, c.Labels = encoder.HeadClassification, labels
	c.Architecture = encoder.ArchitectureOf(c.ModelType, c.Head)
	c.ProblemType = ""
	if len(labels) == 1 {
		c.ProblemType = encoder.ProblemRegression
	}
	want := encoder.Shapes(c)
	params := models.Params{}
	for name, t := range m.Params() {
		if _, keep := want[name]; keep {
			params[name] = t
		}
	}
	r := rand.New(rand.NewPCG(seed, 0x4ead))
	var missing []string
	for name := range want {
		if _, ok := params[name]; !ok {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing) // draw in a fixed order
	for _, name := range missing {
		if !strings.HasPrefix(name, "classifier.") && !strings.HasPrefix(name, "bert.pooler.") {
			return nil, nil, fmt.Errorf("the model has no %s: it is not a complete encoder", name)
		}
		dims := want[name]
		n := 1
		for _, d := range dims {
			n *= d
		}
		data := make([]float32, n)
		if len(dims) == 2 {
			for i := range data {
				data[i] = float32(0.02 * r.NormFloat64())
			}
		}
		params[name] = tensors.FromFlatDataAndDimensions(data, dims...)
	}
	cj, err := c.JSON()
	if err != nil {
		return nil, nil, err
	}
	return cj, params, nil
}
