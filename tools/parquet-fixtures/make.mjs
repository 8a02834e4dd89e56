// Writes memfit's parquet test fixtures (data/hfdata/testdata) with two writers other than memfit's reader
// library: DuckDB (@duckdb/node-api, its own C++ parquet writer) and parquet-wasm (arrow-rs, the Rust parquet
// crate); `tar` on the PATH extracts the CIFAR-10 images. Each parquet file is made from a JSONL file written
// first from the shared real data (alpaca-libre, War and Peace, GLUE, CIFAR-10), so a test can check that memfit
// reads the same rows from the parquet file as
// from its JSONL. Usage (from this folder): npm ci && node make.mjs [../../../shared/data]
//
// What the files exercise: snappy and zstd compression, dictionary-encoded strings, several row groups, a
// nested image struct{bytes, path} with the `datasets` "huggingface" metadata, a list<struct{role, content}>
// messages column, and the hub layouts data/SPLIT-0000N-of-0000M.parquet and SPLIT/*.parquet.

import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { DuckDBInstance } from '@duckdb/node-api';
import * as arrow from 'apache-arrow';
import * as pw from 'parquet-wasm/node';
import jpeg from 'jpeg-js';
import { PNG } from 'pngjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const shared = path.resolve(process.argv[2] ?? path.join(here, '../../../shared/data'));
const out = path.resolve(here, '../../data/hfdata/testdata');
fs.mkdirSync(out, { recursive: true });

const writeJSONL = (name, rows) =>
  fs.writeFileSync(path.join(out, name), rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
const readTSV = (file) =>
  fs.readFileSync(file, 'utf8').split('\n').filter((l) => l.trim() !== '').map((l) => l.split('\t'));

// --- JSONL sources, from the shared data ---------------------------------------------------------------
// Alpaca: the first 48 rows of alpaca-libre v1, rejected rows (status other than ok) included.
const alpacaAll = fs.readFileSync(path.join(shared, 'alpaca-libre/alpaca_libre_tasks_v1.jsonl'), 'utf8')
  .split('\n').filter((l) => l.trim() !== '').map((l) => JSON.parse(l));
const alpaca = alpacaAll.slice(0, 48).map((r) => ({ instruction: r.instruction, input: r.input, output: r.output, status: r.status }));
writeJSONL('alpaca.jsonl', alpaca);

// Messages: 24 usable Alpaca rows as conversations (a system prompt, the user's turn, the assistant's).
const ok = alpacaAll.filter((r) => r.status === 'ok').slice(0, 24);
const messages = ok.map((r) => ({
  messages: [
    { role: 'system', content: 'You are a helpful assistant.' },
    { role: 'user', content: r.input ? `${r.instruction}\n\n${r.input}` : r.instruction },
    { role: 'assistant', content: r.output },
  ],
}));
writeJSONL('messages.jsonl', messages);
// The same conversations in the ShareGPT form: conversations: [{from: system|human|gpt, value}].
const shareFrom = { system: 'system', user: 'human', assistant: 'gpt' };
writeJSONL('sharegpt.jsonl', messages.map((r) => ({ conversations: r.messages.map((m) => ({ from: shareFrom[m.role], value: m.content })) })));

// Text: 40 paragraphs of War and Peace (one document per row, as `datasets` text corpora store them).
const paragraphs = fs.readFileSync(path.join(shared, 'text/war-and-peace.txt'), 'utf8').replace(/\r\n/g, '\n')
  .split('\n\n').map((p) => p.trim()).filter((p) => p.length > 200);
const text = paragraphs.slice(100, 140).map((p) => ({ text: p }));
writeJSONL('text.jsonl', text);

// GLUE, in the columns of the hub's "glue" dataset: sst2 (sentence, label), rte (sentence1, sentence2, label:
// 0 entailment, 1 not_entailment), stsb (sentence1, sentence2, label: float score).
const sst2 = readTSV(path.join(shared, 'glue/SST-2/train.tsv')).slice(1, 41).map(([s, l]) => ({ sentence: s.trim(), label: Number(l) }));
writeJSONL('sst2.jsonl', sst2);
const rte = readTSV(path.join(shared, 'glue/RTE/train.tsv')).slice(1, 25)
  .map((c) => ({ sentence1: c[1], sentence2: c[2], label: c[3].trim() === 'entailment' ? 0 : 1 }));
writeJSONL('rte.jsonl', rte);
const stsb = readTSV(path.join(shared, 'glue/STS-B/train.tsv')).slice(1, 25)
  .map((c) => ({ sentence1: c[7], sentence2: c[8], label: Number(c[9]) }));
writeJSONL('stsb.jsonl', stsb);

// Images: 2 CIFAR-10 training images per class, re-encoded from the tar's JPEG as PNG (as a user's own
// `datasets` Image column holds PNG bytes), labels in the class order of the names (sorted, as memfit's image
// folders number them).
const classes = ['airplane', 'automobile', 'bird', 'cat', 'deer', 'dog', 'frog', 'horse', 'ship', 'truck'];
const images = [];
const jpegs = []; // the tar's JPEG bytes as they are, for a plain binary image column
for (const [label, cls] of classes.entries()) {
  for (const n of ['0000', '0001']) {
    const member = `train/${cls}/${n}.jpg`;
    const jpg = execFileSync('tar', ['-xOf', path.join(shared, 'cifar10/cifar10-subset-jpg.tar'), member], { maxBuffer: 1 << 20 });
    const raw = jpeg.decode(jpg, { useTArray: true });
    const png = new PNG({ width: raw.width, height: raw.height });
    raw.data.forEach((v, i) => { png.data[i] = v; });
    const bytes = PNG.sync.write(png);
    images.push({ image: { bytes: bytes.toString('base64'), path: `${cls}/${n}.png` }, label });
    if (n === '0000') jpegs.push({ image: jpg.toString('base64'), label, path: `${cls}/${n}.jpg` });
  }
}
writeJSONL('images.jsonl', images);
writeJSONL('images-jpeg.jsonl', jpegs);
const hfImageMeta = JSON.stringify({
  info: { features: { image: { _type: 'Image' }, label: { names: classes, _type: 'ClassLabel' } } },
});

// --- DuckDB ---------------------------------------------------------------------------------------------
const db = await DuckDBInstance.create(':memory:');
const con = await db.connect();
const q = (s) => s.replace(/'/g, "''");
const src = (name) => `read_json('${q(path.join(out, name))}', format = 'newline_delimited')`;
const copy = async (select, file, opts) => {
  fs.mkdirSync(path.dirname(path.join(out, file)), { recursive: true });
  await con.run(`COPY (${select}) TO '${q(path.join(out, file))}' (FORMAT parquet, ${opts})`);
};
// Snappy, row groups of 16 rows (DuckDB's own writer; strings dictionary-encoded where it pays).
await copy(`SELECT instruction, input, output, status FROM ${src('alpaca.jsonl')}`, 'alpaca.duckdb.parquet',
  'COMPRESSION snappy, ROW_GROUP_SIZE 16');
await copy(`SELECT text FROM ${src('text.jsonl')}`, 'text.duckdb.parquet', 'COMPRESSION zstd');
await copy(`SELECT sentence, label::BIGINT AS label FROM ${src('sst2.jsonl')}`, 'sst2.duckdb.parquet', 'COMPRESSION snappy');
await copy(`SELECT sentence1, sentence2, label::BIGINT AS label FROM ${src('rte.jsonl')}`, 'rte.duckdb.parquet', 'COMPRESSION zstd');
await copy(`SELECT sentence1, sentence2, label::FLOAT AS label FROM ${src('stsb.jsonl')}`, 'stsb.duckdb.parquet', 'COMPRESSION zstd');
await copy(`SELECT messages FROM ${src('messages.jsonl')}`, 'messages.duckdb.parquet', 'COMPRESSION zstd');
await copy(`SELECT conversations FROM ${src('sharegpt.jsonl')}`, 'sharegpt.duckdb.parquet', 'COMPRESSION snappy');
await copy(`SELECT struct_pack(bytes := from_base64(image.bytes), path := image.path) AS image, label::BIGINT AS label FROM ${src('images.jsonl')}`,
  'images.duckdb.parquet', `COMPRESSION snappy, ROW_GROUP_SIZE 8, KV_METADATA {huggingface: '${q(hfImageMeta)}'}`);
// JPEG bytes in a plain BLOB column (no struct), labels as INTEGER (int32).
await copy(`SELECT from_base64(image) AS image, label::INTEGER AS label FROM ${src('images-jpeg.jsonl')}`, 'images-jpeg.duckdb.parquet', 'COMPRESSION zstd');
// A hub folder whose split is a folder: text/train/*.parquet (two shards) and text/test/0000.parquet.
await copy(`SELECT text FROM ${src('text.jsonl')} LIMIT 20`, 'hub-text/train/0000.parquet', 'COMPRESSION zstd');
await copy(`SELECT text FROM ${src('text.jsonl')} OFFSET 20 LIMIT 12`, 'hub-text/train/0001.parquet', 'COMPRESSION zstd');
await copy(`SELECT text FROM ${src('text.jsonl')} OFFSET 32`, 'hub-text/test/0000.parquet', 'COMPRESSION zstd');

// Issue 36's probe cases (testdata/probe), each as DuckDB writes it. A MAP column m beside a string sentence and
// an integer label: renamed with --columns to each name memfit type-checks (text, messages, instruction, label,
// image), it must be refused as a map, not recurse.
await copy(`SELECT MAP {'k': sentence} AS m, sentence, label::BIGINT AS label FROM ${src('sst2.jsonl')} LIMIT 8`, 'probe/map.parquet', 'COMPRESSION snappy');
await copy(`SELECT MAP {'k': sentence} AS text FROM ${src('sst2.jsonl')} LIMIT 8`, 'probe/map-text.parquet', 'COMPRESSION snappy');
// LZ4_RAW pages (DuckDB's COMPRESSION lz4, pyarrow's compression='lz4'), which parquet-go v0.32.0 misreads when a
// page compresses less than 3:1 (pq29_lz4); the same rows as alpaca.jsonl.
await copy(`SELECT instruction, input, output, status FROM ${src('alpaca.jsonl')}`, 'probe/alpaca-lz4.duckdb.parquet', 'COMPRESSION lz4, ROW_GROUP_SIZE 16');

// --- parquet-wasm (arrow-rs) ----------------------------------------------------------------------------
const writeArrow = (table, file, { compression, rowGroup, meta, version } = {}) => {
  let props = new pw.WriterPropertiesBuilder().setCompression(compression).setDictionaryEnabled(true);
  if (rowGroup) props = props.setMaxRowGroupSize(rowGroup);
  if (version !== undefined) props = props.setWriterVersion(version);
  if (meta) props = props.setKeyValueMetadata(new Map(Object.entries(meta)));
  const wasmTable = pw.Table.fromIPCStream(arrow.tableToIPC(table, 'stream'));
  const bytes = pw.writeParquet(wasmTable, props.build());
  fs.mkdirSync(path.dirname(path.join(out, file)), { recursive: true });
  fs.writeFileSync(path.join(out, file), bytes);
};
const utf8 = (xs) => arrow.vectorFromArray(xs, new arrow.Utf8());
const alpacaTable = (rows) => new arrow.Table({
  instruction: utf8(rows.map((r) => r.instruction)),
  input: utf8(rows.map((r) => r.input)),
  output: utf8(rows.map((r) => r.output)),
  status: utf8(rows.map((r) => r.status)),
});
// zstd, dictionary encoding, row groups of 10 rows (5 row groups).
writeArrow(alpacaTable(alpaca), 'alpaca.arrow.parquet', { compression: pw.Compression.ZSTD, rowGroup: 10 });
// LZ4_RAW with data pages v2 (levels stored uncompressed before the values), for issue 36's LZ4_RAW reading.
writeArrow(alpacaTable(alpaca), 'probe/alpaca-lz4-v2.arrow.parquet', { compression: pw.Compression.LZ4_RAW, rowGroup: 10, version: pw.WriterVersion.V2 });
// The hub layout `datasets` writes: data/train-0000N-of-00002.parquet and data/test-00000-of-00001.parquet.
writeArrow(alpacaTable(alpaca.slice(0, 24)), 'hub-alpaca/data/train-00000-of-00002.parquet', { compression: pw.Compression.SNAPPY, rowGroup: 8 });
writeArrow(alpacaTable(alpaca.slice(24, 40)), 'hub-alpaca/data/train-00001-of-00002.parquet', { compression: pw.Compression.SNAPPY, rowGroup: 8 });
writeArrow(alpacaTable(alpaca.slice(40)), 'hub-alpaca/data/test-00000-of-00001.parquet', { compression: pw.Compression.SNAPPY });

const msgType = new arrow.List(new arrow.Field('item', new arrow.Struct([
  new arrow.Field('role', new arrow.Utf8(), true), new arrow.Field('content', new arrow.Utf8(), true)]), true));
writeArrow(new arrow.Table({ messages: arrow.vectorFromArray(messages.map((r) => r.messages), msgType) }),
  'messages.arrow.parquet', { compression: pw.Compression.ZSTD, rowGroup: 10 });

const imgType = new arrow.Struct([new arrow.Field('bytes', new arrow.Binary(), true), new arrow.Field('path', new arrow.Utf8(), true)]);
writeArrow(new arrow.Table({
  image: arrow.vectorFromArray(images.map((r) => ({ bytes: Buffer.from(r.image.bytes, 'base64'), path: r.image.path })), imgType),
  label: arrow.vectorFromArray(images.map((r) => BigInt(r.label)), new arrow.Int64()),
}), 'images.arrow.parquet', { compression: pw.Compression.ZSTD, rowGroup: 6, meta: { huggingface: hfImageMeta } });

for (const f of fs.readdirSync(out, { recursive: true }).sort()) {
  const p = path.join(out, f);
  if (fs.statSync(p).isFile()) console.log(`${String(fs.statSync(p).size).padStart(8)} ${f}`);
}
