// The independent reference of the BPE parity test (test_tokenizer.cpp):
// gpt-3-encoder's JavaScript GPT-2 encoder, installed by env/setup.sh into
// env/npm/node_modules. Reads a JSON array of strings, prints a JSON array
// of their GPT-2 ids (no special tokens).
//   node gpt2_reference_encode.js MODULE_DIR TEXTS_JSON
'use strict';
const fs = require('fs');
const path = require('path');

const [moduleDir, textsFile] = process.argv.slice(2);
if (!moduleDir || !textsFile) {
  console.error('usage: node gpt2_reference_encode.js MODULE_DIR TEXTS_JSON');
  process.exit(2);
}
const { encode } = require(path.resolve(moduleDir, 'Encoder.js'));
const texts = JSON.parse(fs.readFileSync(textsFile, 'utf-8'));
process.stdout.write(JSON.stringify(texts.map((text) => encode(text))) + '\n');
