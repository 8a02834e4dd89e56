package chattemplate_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ardanlabs/jinja"

	"github.com/memfit/memfit/chattemplate"
)

// TestRenderIsBounded: a template that would not end is refused in one error, as transformers' sandboxed
// Jinja2 refuses it (probe 2026-11-27-b, tg_rangebomb: range(100000000) hung; tg_recursion: a macro calling
// itself overflowed the stack, a fatal error). Templates within the bounds render as the engine renders them:
// range() as Python's, macros and recursive loops (with every whitespace control) byte for byte unchanged.
func TestRenderIsBounded(t *testing.T) {
	msgs := []message{{Role: "user", Content: "hi"}, {Role: "assistant", Content: "yo"}}
	for _, c := range []struct{ name, src, want string }{
		{"range over the sandbox limit", "{% for i in range(100000000) %}x{% endfor %}", "range of 100000000 items: a chat template's range() may have at most 100000"},
		{"nested ranges", "{% for i in range(100000) %}{% for j in range(1000) %}x{% endfor %}{% endfor %}", "range() calls make more than 1000000 items"},
		{"macro calling itself", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "runaway recursion"},
		{"macro with whitespace controls", "{%- macro f(n) -%}\n  {{- f(n + 1) -}}\n{%- endmacro -%}{{ f(0) }}", "runaway recursion"},
		{"recursive loop over a list holding itself", "{% set x = [] %}{% set _ = x.append(x) %}{% for i in x recursive %}{{ loop(i) }}{% endfor %}", "runaway recursion"},
	} {
		tmpl, err := chattemplate.New(c.src, "t", nil)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		start := time.Now()
		_, err = tmpl.Render(msgs, false)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: got %v, want one line with %q", c.name, err, c.want)
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Errorf("%s: refused after %v", c.name, d)
		}
	}

	for _, src := range []string{
		"{{ range(5)|list }} {{ range(2, 9, 3)|list }} {{ range(9, 2, -3)|list }} {{ range(3, 3)|list }} {{ range(5, 1)|list }} {{ range(0)|list }} {{ range(True)|list }}",
		"{% for i in range(messages|length) %}{{ i }}:{{ messages[i].content }} {% endfor %}",
		"{% macro turn(m) %}\n<{{ m.role }}>{{ m.content }}\n{% endmacro %}\n{% for m in messages %}\n  {{ turn(m) }}\n{% endfor %}",
		"{%- macro turn(m, sep='|') -%}\n  {{ m.role }}{{ sep }}{{ m.content }}\n{%- endmacro -%}\n{%- for m in messages -%}{{ turn(m) }}\n{% endfor %}",
		"{% macro f(n) +%}\n{{ n }}{% if n < 40 %}{{ f(n + 1) }}{% endif %}\n{% endmacro %}{{ f(0) }}",
		"{% macro outer(xs) %}{% for x in xs recursive %}[{{ x.content if x.content is defined else x }}{% if x is iterable and x is not string and x is not mapping %}{{ loop(x) }}{% endif %}]{% endfor %}{% endmacro %}{{ outer(messages) }}",
	} {
		tmpl, err := chattemplate.New(src, "t", nil)
		if err != nil {
			t.Fatalf("%q: %v", src, err)
		}
		got, err := tmpl.Render(msgs, false)
		if err != nil {
			t.Fatalf("%q: %v", src, err)
		}
		plain, err := jinja.Compile(src)
		if err != nil {
			t.Fatal(err)
		}
		list := make([]any, len(msgs))
		for i, m := range msgs {
			list[i] = map[string]any{"role": m.Role, "content": m.Content}
		}
		want, err := plain.Render(map[string]any{"messages": list})
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%q renders\n%q\nwhere the engine alone renders\n%q", src, got, want)
		}
	}
}
