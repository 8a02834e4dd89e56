module github.com/memfit/memfit/tools/hubcheck

go 1.27.0

require (
	github.com/gomlx/go-huggingface v0.4.12
	github.com/memfit/memfit v0.0.0
)

require (
	github.com/gofrs/flock v0.13.0 // indirect
	github.com/gomlx/compute v0.1.14 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	golang.org/x/sys v0.49.0 // indirect
)

// The stand-in Hub (hfhub/hubtest) of this checkout; the main module has no replace directive.
replace github.com/memfit/memfit => ../..
