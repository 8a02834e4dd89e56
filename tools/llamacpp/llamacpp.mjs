// Runs a GGUF file through llama.cpp (node-llama-cpp's prebuilt CPU binaries) for memfit's checks and its
// `finetune bench generate`: reads one JSON request on stdin, prints one JSON result on stdout.
//
//   node tools/llamacpp/llamacpp.mjs < request.json
//
// or several requests in one process (one llama.cpp, each model loaded in turn): {"requests": [request, ...]}
// answered by {"results": [result, ...]}.
//
// Request (every part but "model" optional):
//   {"model": "FILE.gguf", "threads": 1, "context_size": 512, "vocab_only": false, "kv_cache_type": "F32",
//    "tokenize": [{"text": "...", "special": true, "add_special": false}, ...],
//    "generate": {"prompt": [ids], "tokens": 32, "probabilities": true},
//    "score":    {"sequences": [[ids], ...], "probabilities": false},
//    "bench":    {"prompts": [[ids], ...], "new_tokens": 128, "runs": 3}}
//
// Result:
//   {"llama_cpp": {...}, "model": {"vocab": n, "bos": id, "eos": id, "eot": id, "add_bos": bool, ...},
//    "tokenize": [[ids], ...],
//    "generate": {"tokens": [ids], "probabilities": [[p(id) for id in 0..vocab-1], ...]},
//    "score":    [{"top": [ids], "top_prob": [p], "probabilities": [[...]]}, ...],
//    "bench":    {"runs": [{"prefill_seconds": s, "decode_seconds": s, "tokens": [[ids], ...]}, ...]}}
//
// "tokenize": "special" parses special-token text (<|begin_of_text|>) as the special token; "add_special" adds
// the BOS (and EOS) the GGUF's tokenizer.ggml.add_bos_token/add_eos_token ask for, as llama.cpp's own tools do.
// "generate": greedy decoding of "tokens" new tokens after the prompt's ids (no EOS stop); "probabilities" adds
// the next-token distribution each new token was chosen from (LlamaContextSequence.evaluateWithMetadata).
// "score": teacher-forced, the greedy next token (and its probability) after every prefix of each sequence
// (LlamaContextSequence.controlledEvaluate); "probabilities" adds the full distributions.
// "bench": greedy decoding of every prompt at once, one context sequence per prompt (llama.cpp batches them into
// one decode per step), one warm-up run, then "runs" timed runs: prefill = until every row has its first token,
// decode = from there to the last token.
//
// Errors: one line on stderr, exit status 1.
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

function fail(msg) {
    process.stderr.write(`llamacpp: ${msg}\n`);
    process.exit(1);
}

async function readStdin() {
    const chunks = [];
    for await (const c of process.stdin)
        chunks.push(c);
    return Buffer.concat(chunks).toString("utf8");
}

// dense turns node-llama-cpp's probability map (token -> p, sorted by p) into an array indexed by token id.
function dense(map, vocab) {
    const out = new Array(vocab).fill(0);
    for (const [tok, p] of map)
        if (tok >= 0 && tok < vocab)
            out[tok] = p;
    return out;
}

function checkIds(name, ids, vocab) {
    if (!Array.isArray(ids) || ids.length === 0)
        fail(`${name}: give a non-empty list of token ids`);
    for (const id of ids)
        if (!Number.isInteger(id) || id < 0 || id >= vocab)
            fail(`${name}: token id ${id} is outside the model's vocabulary (0..${vocab - 1})`);
}

async function generate(context, req, vocab) {
    const seq = context.getSequence();
    checkIds("generate.prompt", req.prompt, vocab);
    const want = req.tokens ?? 32;
    const tokens = [], probabilities = [];
    const it = seq.evaluateWithMetadata(req.prompt, {probabilities: !!req.probabilities}, {temperature: 0, yieldEogToken: true});
    for await (const out of it) {
        tokens.push(out.token);
        if (req.probabilities)
            probabilities.push(dense(out.probabilities, vocab));
        if (tokens.length >= want)
            break;
    }
    seq.dispose();
    return req.probabilities ? {tokens, probabilities} : {tokens};
}

async function score(context, req, vocab) {
    const results = [];
    const seq = context.getSequence();
    for (const [i, ids] of (req.sequences ?? []).entries()) {
        checkIds(`score.sequences[${i}]`, ids, vocab);
        await seq.clearHistory();
        const next = {token: true, confidence: true, probabilities: !!req.probabilities, options: {temperature: 0}};
        const outs = await seq.controlledEvaluate(ids.map((t) => [t, {generateNext: next}]));
        const r = {top: [], top_prob: []};
        if (req.probabilities)
            r.probabilities = [];
        for (let j = 0; j < ids.length; j++) {
            const o = outs[j];
            if (o?.next?.token == null)
                fail(`score: llama.cpp returned no next token at position ${j}`);
            r.top.push(o.next.token);
            r.top_prob.push(o.next.confidence);
            if (req.probabilities)
                r.probabilities.push(dense(o.next.probabilities, vocab));
        }
        results.push(r);
    }
    seq.dispose();
    return results;
}

// benchRun decodes every prompt greedily, one sequence each (emptied first), all at once.
async function benchRun(seqs, prompts, newTokens) {
    await Promise.all(seqs.map((seq) => seq.clearHistory()));
    const start = process.hrtime.bigint();
    const firstAt = new Array(prompts.length), tokens = prompts.map(() => []);
    await Promise.all(prompts.map(async (p, row) => {
        for await (const t of seqs[row].evaluate(p, {temperature: 0, yieldEogToken: true})) {
            if (tokens[row].length === 0)
                firstAt[row] = process.hrtime.bigint();
            tokens[row].push(t);
            if (tokens[row].length >= newTokens)
                break;
        }
    }));
    const end = process.hrtime.bigint();
    const prefillEnd = firstAt.reduce((a, b) => (b > a ? b : a));
    return {
        prefill_seconds: Number(prefillEnd - start) / 1e9,
        decode_seconds: Number(end - prefillEnd) / 1e9,
        tokens
    };
}

// kvCache returns the context options for the request's kv_cache_type: "F32" keeps llama.cpp's key/value cache
// in float32, "F16" (its default) or nothing in float16.
function kvCache(req) {
    const kv = req.kv_cache_type;
    if (kv == null)
        return {};
    if (kv !== "F32" && kv !== "F16")
        fail(`kv_cache_type ${kv}: give F32 or F16`);
    return {experimentalKvCacheKeyType: kv, experimentalKvCacheValueType: kv};
}

async function bench(model, req, threads, vocab, top) {
    const prompts = req.prompts ?? [];
    if (prompts.length === 0)
        fail("bench.prompts: give at least one prompt");
    prompts.forEach((p, i) => checkIds(`bench.prompts[${i}]`, p, vocab));
    const newTokens = req.new_tokens ?? 128, runs = req.runs ?? 3;
    const longest = Math.max(...prompts.map((p) => p.length));
    const context = await model.createContext({
        sequences: prompts.length,
        contextSize: prompts.length * (longest + newTokens + 1),
        batchSize: Math.max(512, prompts.length * longest),
        threads, flashAttention: false, ...kvCache(top)
    });
    const seqs = prompts.map(() => context.getSequence());
    const out = {threads, sequences: prompts.length, runs: []};
    await benchRun(seqs, prompts, newTokens); // warm-up
    for (let r = 0; r < runs; r++)
        out.runs.push(await benchRun(seqs, prompts, newTokens));
    await context.dispose();
    return out;
}

// runOne answers one request (its model loaded and disposed of within).
async function runOne(llama, req) {
    if (typeof req.model !== "string" || req.model === "")
        fail(`give "model": the path of a GGUF file`);
    const threads = req.threads ?? 1;
    let model;
    try {
        model = await llama.loadModel({modelPath: req.model, gpuLayers: 0, vocabOnly: !!req.vocab_only});
    } catch (e) {
        fail(`${req.model}: llama.cpp cannot load it: ${e.message}`);
    }
    const vocab = model.fileInfo.metadata?.tokenizer?.ggml?.tokens?.length ?? 0;
    if (vocab === 0)
        fail(`${req.model}: no tokenizer.ggml.tokens in its metadata`);
    const result = {
        llama_cpp: {package: "node-llama-cpp", build: llama.buildType, system_info: llama.systemInfo.trim()},
        model: {
            vocab, vocab_type: model.vocabularyType,
            bos: model.tokens.bos, eos: model.tokens.eos, eot: model.tokens.eot,
            add_bos: model.tokens.shouldPrependBosToken, add_eos: model.tokens.shouldAppendEosToken,
            train_context_size: model.trainContextSize
        }
    };
    if (req.tokenize) {
        result.tokenize = req.tokenize.map((t) => {
            let ids = model.tokenize(t.text, !!t.special);
            if (t.add_special) {
                if (model.tokens.shouldPrependBosToken && model.tokens.bos != null)
                    ids = [model.tokens.bos, ...ids];
                if (model.tokens.shouldAppendEosToken && model.tokens.eos != null)
                    ids = [...ids, model.tokens.eos];
            }
            return ids;
        });
    }
    if (req.generate || req.score) {
        if (req.vocab_only)
            fail("generate and score need the model's weights: leave vocab_only out");
        const context = await model.createContext({
            sequences: 2, contextSize: req.context_size ?? Math.min(model.trainContextSize, 2048),
            threads, flashAttention: false,
            ...kvCache(req)
        });
        if (req.generate)
            result.generate = await generate(context, req.generate, vocab);
        if (req.score)
            result.score = await score(context, req.score, vocab);
        await context.dispose();
    }
    if (req.bench)
        result.bench = await bench(model, req.bench, threads, vocab, req);
    await model.dispose();
    return result;
}

async function main() {
    let req;
    try {
        req = JSON.parse(await readStdin());
    } catch (e) {
        fail(`the request on stdin is not JSON: ${e.message}`);
    }
    const llama = await getLlama({gpu: false, build: "never", maxThreads: 0, logLevel: LlamaLogLevel.error,
        logger: (level, message) => process.stderr.write(message.endsWith("\n") ? message : message + "\n")});
    let out;
    if (Array.isArray(req.requests)) {
        const results = [];
        for (const r of req.requests)
            results.push(await runOne(llama, r));
        out = {results};
    } else
        out = await runOne(llama, req);
    await llama.dispose();
    process.stdout.write(JSON.stringify(out) + "\n");
}

main().catch((e) => fail(e?.message ?? String(e)));
