package chattemplate

// Bounds on what a template may do while rendering one conversation. A chat template comes with the model (from
// the Hub, from anyone); transformers renders it in Jinja2's ImmutableSandboxedEnvironment, where range() is
// limited to MAX_RANGE (100000) items and runaway recursion ends in Python's RecursionError. The Go engine has
// neither: range(100000000) builds a list of 1e8 values (memfit hung, its memory growing), and a macro that calls
// itself overflowed the goroutine stack, a fatal error no recover catches. So the template is rendered with
// range() replaced by one with Jinja2's limit (and a budget for the whole render), and every macro call and
// recursive loop item makes a call that counts them (guardSource), refusing a render that goes past maxCalls: far more
// than any real template makes (a few per message), far fewer than the depth at which the stack overflows
// (a macro nested 100000 deep still renders).

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/ardanlabs/jinja"
)

const (
	// maxRange is Jinja2's sandbox MAX_RANGE: the most items one range() may have.
	maxRange = 100_000
	// maxRangeTotal is the most range() items one render may make in all (nested loops multiply).
	maxRangeTotal = 1_000_000
	// maxCalls is the most macro calls and recursive loop bodies one render may run.
	maxCalls = 50_000
	// guardName is the variable of the counting call the guarded source makes.
	guardName = "__memfit_guard"
)

// macroTag matches {% macro NAME(PARAMS) %} (PARAMS up to the ")" that ends the tag); recursiveFor matches
// {% for ... recursive %} without an if filter of its own.
var (
	macroTag     = regexp.MustCompile(`(?s)(\{%[-+]?\s*macro\s+\w+\s*\()(.*?)(\)\s*[-+]?%\})`)
	recursiveFor = regexp.MustCompile(`(?s)(\{%[-+]?\s*for\s(?:[^%]*?))(\srecursive\s*[-+]?%\})`)
)

// guardSource makes every macro call and every recursive loop item call the counting guard, without changing
// what the template writes (its text and whitespace are untouched): a macro gets a last parameter whose default
// is the call (the engine, as Jinja2, evaluates a default at each call: {% macro f(x, __memfit_guard_=
// __memfit_guard()) %}), a recursive loop an if filter that calls it and is always true ({% for x in xs if
// __memfit_guard() recursive %}). A recursive loop that has an if filter of its own is left as it is.
func guardSource(src string) string {
	src = macroTag.ReplaceAllStringFunc(src, func(tag string) string {
		m := macroTag.FindStringSubmatch(tag)
		sep := ", "
		if strings.TrimSpace(m[2]) == "" {
			sep = ""
		}
		return m[1] + m[2] + sep + guardName + "_=" + guardName + "()" + m[3]
	})
	return recursiveFor.ReplaceAllStringFunc(src, func(tag string) string {
		m := recursiveFor.FindStringSubmatch(tag)
		if strings.Contains(m[1], " if ") {
			return tag
		}
		return m[1] + " if " + guardName + "()" + m[2]
	})
}

// limits are the bounded range() and the call guard of one render.
type limits struct {
	rangeItems, calls int
}

// install puts the bounded range() and the guard into a render's variables (over the engine's builtins).
func (l *limits) install(data map[string]jinja.Value) {
	data["range"] = jinja.NewCallable("range", l.rangeFn)
	data[guardName] = jinja.NewCallable(guardName, func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
		if l.calls++; l.calls > maxCalls {
			return jinja.Undefined(), fmt.Errorf("the template runs its macros or recursive loops more than %d times for one conversation: it does not end (runaway recursion)", maxCalls)
		}
		return jinja.NewBool(true), nil
	})
}

// rangeFn is Python's range(stop) / range(start, stop[, step]) over integers, refusing more than maxRange items
// as Jinja2's sandbox does, and more than maxRangeTotal in one render.
func (l *limits) rangeFn(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	var n [3]int64
	for i, a := range args {
		if i >= 3 {
			break
		}
		switch {
		case a.IsInt():
			n[i] = a.AsInt()
		case a.IsBool():
			if a.AsBool() {
				n[i] = 1
			}
		default:
			return jinja.Undefined(), fmt.Errorf("range: %s is not an integer", a.String())
		}
	}
	var start, stop, step int64
	switch len(args) {
	case 1:
		stop, step = n[0], 1
	case 2:
		start, stop, step = n[0], n[1], 1
	case 3:
		start, stop, step = n[0], n[1], n[2]
	default:
		return jinja.Undefined(), fmt.Errorf("range: expected 1 to 3 arguments, got %d", len(args))
	}
	if step == 0 {
		return jinja.Undefined(), fmt.Errorf("range: step must not be zero")
	}
	var count uint64 // the items, counted in unsigned arithmetic (no overflow at the int64 ends)
	ceil := func(d, s uint64) uint64 { return d/s + min(d%s, 1) }
	switch {
	case step > 0 && stop > start:
		count = ceil(uint64(stop)-uint64(start), uint64(step))
	case step < 0 && stop < start:
		count = ceil(uint64(start)-uint64(stop), -uint64(step))
	}
	if count > maxRange {
		return jinja.Undefined(), fmt.Errorf("range of %d items: a chat template's range() may have at most %d (Jinja2's sandbox limit, which transformers renders in)", count, maxRange)
	}
	if l.rangeItems += int(count); l.rangeItems > maxRangeTotal {
		return jinja.Undefined(), fmt.Errorf("the template's range() calls make more than %d items for one conversation: it does not end in reasonable time", maxRangeTotal)
	}
	items := make([]jinja.Value, count)
	for i := range items {
		items[i] = jinja.NewInt(start + int64(i)*step)
	}
	return jinja.NewList(items), nil
}
