package cli

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/finetune"
)

// memorySettings are the training settings that shape the step `memory` plans: the method and its adapters' rank,
// dropout and targets, the trained modules, the optimizer (its state), the micro-batch, the compute dtype and the
// attention. The rest of the training config (LoRA alpha, learning rate, schedule, steps, logging, seed, ...)
// changes no byte of the plan, and the
// memory-saving options are the variants it compares (--variants); a --config file may still hold them all.
var memorySettings = []string{"method", "lora_r", "lora_dropout", "lora_targets", "train_modules",
	"optimizer", "batch_size", "compute_dtype", "attention", "objective", "precompute_ref"}

// bindSettings registers a flag for each training setting of finetune.Settings named by keys (every setting when
// keys is empty), in the table's order, with the setting's help and c's value as its default; the flags write
// into c. Settings with a GPU default say so in their help when gpuNote is set (commands that resolve their
// config with finetune.Resolve).
func bindSettings(f *pflag.FlagSet, c *finetune.Config, gpuNote bool, keys ...string) {
	for _, s := range finetune.Settings {
		if len(keys) > 0 && !slices.Contains(keys, s.Key) {
			continue
		}
		help := s.Help
		if gpuNote && s.GPUDefault != "" {
			help += " (default on --backend xla:cuda: " + s.GPUDefault + ")"
		}
		switch p := s.Field(c).(type) {
		case *string:
			f.StringVar(p, s.Flag(), *p, help)
		case *int:
			f.IntVar(p, s.Flag(), *p, help)
		case *uint64:
			f.Uint64Var(p, s.Flag(), *p, help)
		case *float64:
			f.Float64Var(p, s.Flag(), *p, help)
		case *bool:
			f.BoolVar(p, s.Flag(), *p, help)
		case *[]string:
			f.StringSliceVar(p, s.Flag(), *p, help)
		default:
			panic(fmt.Sprintf("setting %s: no flag for a field of type %T", s.Key, p)) // a new field type: a bug here
		}
	}
	for _, k := range keys {
		if _, ok := finetune.SettingByKey(k); !ok {
			panic("bindSettings: unknown setting " + k)
		}
	}
}

// resolveConfig is the training config of a command that bound settings into flagCfg: finetune.Resolve over the
// defaults, the --config file, the setting flags the user set (by their canonical or deprecated spelling) and the
// backend's GPU defaults, validated; autopilot (a --budget plan) turns MS-norm on unless the file or a flag gave
// ms_norm. An init_adapter given by its Hub id is fetched (its source returned; nil for a local folder). Any
// error is the user's (a usage error), but for the Hub's, returned as they are.
func resolveConfig(cmd *cobra.Command, flagCfg finetune.Config, configFile string, opts *Options, autopilot bool) (finetune.Config, *finetune.HubSource, error) {
	var initHub *finetune.HubSource
	var hubErr error
	cfg, err := finetune.Resolve(finetune.Sources{File: configFile, Flags: flagCfg, Backend: engine.ChooseSpec(opts.Backend), MSNormByDefault: autopilot,
		FlagSet: func(key string) bool {
			s, _ := finetune.SettingByKey(key)
			fl := cmd.Flags().Lookup(s.Flag())
			return fl != nil && fl.Changed
		},
		// An init_adapter named by its Hub id is fetched before its settings are read (probe u6: it was read
		// as a local path, and never found).
		InitAdapter: func(value string) (string, error) {
			var dir string
			dir, initHub, hubErr = hubModel(cmd, "--init-adapter", value, hubFiles)
			return dir, hubErr
		}})
	if hubErr != nil {
		return cfg, nil, hubErr
	}
	if err != nil {
		return cfg, nil, usageError{err}
	}
	return cfg, initHub, nil
}

// aliasOf is the annotation of a deprecated flag spelling: the canonical flag it sets.
const aliasOf = "memfit-alias-of"

// alias registers old as a hidden, deprecated spelling of the flag canonical of f, kept for one release: it sets
// canonical (which then counts as set), and the command notes the new spelling on stderr (noteAliases; not
// pflag's Deprecated, whose note cobra prints to stdout, into a --json output).
func alias(f *pflag.FlagSet, canonical, old string) {
	c := f.Lookup(canonical)
	if c == nil {
		panic("alias: no flag --" + canonical)
	}
	f.AddFlag(&pflag.Flag{Name: old, Usage: c.Usage, Value: aliasValue{f, canonical}, DefValue: c.DefValue,
		NoOptDefVal: c.NoOptDefVal, Hidden: true, Annotations: map[string][]string{aliasOf: {canonical}}})
}

// aliasValue is a deprecated spelling's value: setting it sets the canonical flag.
type aliasValue struct {
	f         *pflag.FlagSet
	canonical string
}

func (a aliasValue) String() string { return a.f.Lookup(a.canonical).Value.String() }
func (a aliasValue) Type() string   { return a.f.Lookup(a.canonical).Value.Type() }

func (a aliasValue) Set(s string) error {
	if err := a.f.Set(a.canonical, s); err != nil {
		// pflag says `invalid argument "x" for "--canonical" flag: why`; the caller adds the same for the alias.
		msg := err.Error()
		if i := strings.Index(msg, " flag: "); i >= 0 {
			msg = msg[i+len(" flag: "):]
		}
		return errors.New(msg)
	}
	return nil
}

// noteAliases writes, for each deprecated flag spelling the user gave, a line naming the canonical one.
func noteAliases(cmd *cobra.Command) {
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if canon := f.Annotations[aliasOf]; len(canon) == 1 {
			fmt.Fprintf(cmd.ErrOrStderr(), "note: --%s is a deprecated spelling of --%s (it goes in a later release)\n", f.Name, canon[0])
		}
	})
}
