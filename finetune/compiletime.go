package finetune

import (
	"time"

	"github.com/gomlx/compute"
)

// StepCompileTimes are the seconds taken to build and compile the programs of one training step.
type StepCompileTimes struct {
	// HostGradient and HostUpdate are the host-side step's two programs (WithHostStep): the gradient
	// computation and the optimizer update.
	HostGradient float64 `json:"host_gradient_seconds"`
	HostUpdate   float64 `json:"host_update_seconds"`
	// Device is the device-resident step's program (one micro-batch per step: forward, backward, update).
	Device float64 `json:"device_seconds"`
}

// PlanCompileTimes builds and compiles on backend, without running them and without any weights, the programs
// of cfg's training step on model (whose parameters have the given shapes) for a batch of shape in, the
// host-side step's and the device-resident step's, and times them.
func PlanCompileTimes(backend compute.Backend, model Model, paramShapes map[string][]int, cfg Config, in Shape) (StepCompileTimes, error) {
	var times StepCompileTimes
	start := time.Now()
	g, _, spec, err := planGraph(backend, model, paramShapes, cfg, in)
	if err != nil {
		return times, err
	}
	times.HostGradient = time.Since(start).Seconds()
	g.Finalize()
	start = time.Now()
	u, err := buildUpdate(backend, cfg, spec.train)
	if err != nil {
		return times, err
	}
	times.HostUpdate = time.Since(start).Seconds()
	u.g.Finalize()
	sp, _, err := buildStepProgram(backend, cfg, spec, progFinal, 1)
	if err != nil {
		return times, err
	}
	times.Device = sp.compileSeconds
	sp.g.Finalize()
	return times, nil
}
