// Renders chat templates with @huggingface/jinja for memfit's chattemplate tests.
// stdin: {"cases": [{"template": "...", "vars": {...}, "now": "2025-07-10T12:00:00"}]}
// stdout: {"results": [{"text": "..."} or {"error": "..."}]}
// Each case's vars are the template's variables as memfit passes them (messages, add_generation_prompt, tools,
// documents, the special tokens); raise_exception throws, as in transformers.js, and strftime_now reads the
// clock, set to "now" when a case gives it (so that both sides render the same date).
import { Template } from "@huggingface/jinja";

const chunks = [];
for await (const c of process.stdin) chunks.push(c);
const req = JSON.parse(Buffer.concat(chunks).toString("utf8"));
const RealDate = Date;
const results = req.cases.map((c) => {
  // strftime_now reads the clock: a fixed one when the case gives "now"
  globalThis.Date = c.now ? fixedDate(new RealDate(c.now)) : RealDate;
  try {
    return { text: new Template(c.template).render(c.vars) };
  } catch (e) {
    return { error: String(e && e.message ? e.message : e) };
  } finally {
    globalThis.Date = RealDate;
  }
});
process.stdout.write(JSON.stringify({ results }));

function fixedDate(at) {
  return class extends RealDate {
    constructor(...args) {
      if (args.length === 0) super(at.getTime());
      else super(...args);
    }
    static now() {
      return at.getTime();
    }
  };
}
