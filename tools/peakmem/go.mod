module github.com/memfit/memfit/tools/peakmem

go 1.26

require (
	github.com/gomlx/gomlx v0.26.0
	github.com/memfit/memfit v0.0.0-00010101000000-000000000000
)

require (
	github.com/dustin/go-humanize v1.0.1 // indirect
	github.com/go-logr/logr v1.4.3 // indirect
	github.com/gomlx/go-xla v0.1.4 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/spf13/cobra v1.10.2 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	github.com/x448/float16 v0.8.4 // indirect
	golang.org/x/exp v0.0.0-20250819193227-8b4c13bb791b // indirect
	golang.org/x/sys v0.39.0 // indirect
	golang.org/x/term v0.38.0 // indirect
	google.golang.org/protobuf v1.36.10 // indirect
	k8s.io/klog/v2 v2.130.1 // indirect
)

// memfit itself, from this checkout.
replace github.com/memfit/memfit => ../..

// GoMLX v0.26.0 with the buffer-pool counter patch; ./setup.sh creates this directory.
replace github.com/gomlx/gomlx => ./third_party/gomlx
