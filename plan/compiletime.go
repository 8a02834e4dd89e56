package plan

import (
	"time"

	"github.com/gomlx/compute"

	"github.com/memfit/memfit/finetune"
)

// CompileTimes are the seconds taken to build and compile the programs of one training step.
type CompileTimes struct {
	// Gradient is the gradient computation alone (forward, loss, backward: the program the planner reads).
	Gradient float64 `json:"gradient_seconds"`
	// Device is the device-resident step's program (one micro-batch per step: forward, backward, update).
	Device float64 `json:"device_seconds"`
}

// TimeCompile builds and compiles on backend, without running them and without any weights, the programs of
// cfg's training step on model (whose parameters have the given shapes) for a batch of shape in, the host-side
// step's and the device-resident step's, and times them.
func TimeCompile(backend compute.Backend, model finetune.Model, paramShapes map[string][]int, cfg finetune.Config, in finetune.Shape) (CompileTimes, error) {
	var times CompileTimes
	start := time.Now()
	shaped, err := stepShapes(model, paramShapes, cfg, in)
	if err != nil {
		return times, err
	}
	step, err := shaped.GradientStep(backend)
	if err != nil {
		return times, err
	}
	times.Gradient = time.Since(start).Seconds()
	step.Graph.Finalize()
	if times.Device, err = shaped.CompileDeviceStep(backend); err != nil {
		return times, err
	}
	return times, nil
}
