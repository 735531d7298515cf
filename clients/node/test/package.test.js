'use strict';
// The package as users get it: `npm pack`, then `npm install <tarball>` into
// a fresh project (dependencies from the npm registry), then an ESM and a
// CommonJS program against the broker, and `tsc --strict` on a user file.
//
// npm pack runs in a copy of this directory (laid out as in the repository,
// beside a copy of proto/), so its prepack build cannot disturb dist/ while
// other test files use it.
const assert = require('node:assert/strict');
const { execFile } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { promisify } = require('node:util');
const { after, before, test } = require('node:test');
const { suiteBroker, queueName, REPO } = require('../harness/helpers');

const run = promisify(execFile);
const ROOT = path.join(__dirname, '..');
const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';

let broker;
let tmp;
let project;
let tarball;
before(async () => {
  broker = await suiteBroker();
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'leaseq-js-pack-'));
});
after(async () => {
  await broker.stop();
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});

const quietNpm = ['--no-audit', '--no-fund', '--loglevel=error', '--no-update-notifier'];

test('npm pack: a self-contained tarball', { timeout: 120000 }, async () => {
  const stage = path.join(tmp, 'repo', 'clients', 'node');
  fs.mkdirSync(stage, { recursive: true });
  fs.cpSync(path.join(REPO, 'proto'), path.join(tmp, 'repo', 'proto'), { recursive: true });
  fs.copyFileSync(path.join(REPO, 'LICENSE'), path.join(tmp, 'repo', 'LICENSE'));
  for (const f of ['package.json', 'package-lock.json', 'tsconfig.json', 'README.md', 'scripts', 'src']) {
    fs.cpSync(path.join(ROOT, f), path.join(stage, f), { recursive: true });
  }
  fs.symlinkSync(path.join(ROOT, 'node_modules'), path.join(stage, 'node_modules'), 'dir');
  const out = path.join(tmp, 'out');
  fs.mkdirSync(out);
  const { stdout } = await run(npm, ['pack', '--json', '--pack-destination', out, ...quietNpm], { cwd: stage, maxBuffer: 1 << 24 });
  const [info] = JSON.parse(stdout.slice(stdout.indexOf('[')));
  tarball = path.join(out, info.filename);
  const files = info.files.map((f) => f.path).sort();
  for (const f of ['dist/cjs/index.js', 'dist/cjs/index.d.ts', 'dist/esm/index.mjs', 'dist/esm/index.d.mts',
    'proto/leaseq/v1/queue.proto', 'proto/leaseq/v1/admin.proto', 'README.md', 'LICENSE', 'package.json']) {
    assert.ok(files.includes(f), `${f} in the tarball (has: ${files.join(', ')})`);
  }
  assert.deepEqual(files.filter((f) => /^(src|test|harness|examples|scripts)\//.test(f)), []);
  assert.ok(!fs.existsSync(path.join(stage, 'proto')), 'postpack removed the proto copy');
  assert.ok(!fs.existsSync(path.join(stage, 'LICENSE')), 'postpack removed the LICENSE copy');
});

test('npm install <tarball> into a fresh project', { timeout: 120000 }, async () => {
  assert.ok(tarball, 'packed by the previous test');
  project = path.join(tmp, 'app');
  fs.mkdirSync(project);
  fs.writeFileSync(path.join(project, 'package.json'), JSON.stringify({ name: 'leaseq-smoke', version: '1.0.0', private: true }));
  await run(npm, ['install', tarball, ...quietNpm], { cwd: project, maxBuffer: 1 << 24 });
  const installed = JSON.parse(fs.readFileSync(path.join(project, 'node_modules', '@leaseq', 'client', 'package.json'), 'utf8'));
  assert.equal(installed.name, '@leaseq/client');
  assert.ok(!fs.existsSync(path.join(project, 'node_modules', 'typescript')), 'no build-time dependency installed');
});

async function node(file, env = {}) {
  const { stdout } = await run(process.execPath, [file], {
    cwd: project,
    env: { ...process.env, LEASEQ_ADDR: broker.addr, ...env },
    timeout: 30000,
  });
  return stdout.trim().split('\n');
}

test('the installed package: import (ESM) against the broker', { timeout: 60000 }, async () => {
  assert.ok(project, 'installed by the previous test');
  fs.copyFileSync(path.join(ROOT, 'examples', 'produce.mjs'), path.join(project, 'produce.mjs'));
  const lines = await node('produce.mjs', { QUEUE: queueName() });
  assert.match(lines[0], /^enqueued [0-9a-f-]{36} duplicate=false$/);
  // One copy of each class behind both entry points.
  fs.writeFileSync(path.join(project, 'same.mjs'), [
    "import { createRequire } from 'node:module';",
    "import * as esm from '@leaseq/client';",
    "const cjs = createRequire(import.meta.url)('@leaseq/client');",
    "const names = Object.keys(esm).sort();",
    "console.log(names.length > 10 && names.every((n) => esm[n] === cjs[n]) ? 'same' : 'different');",
  ].join('\n'));
  assert.deepEqual(await node('same.mjs'), ['same']);
});

test('the installed package: require (CommonJS) against the broker', { timeout: 60000 }, async () => {
  assert.ok(project, 'installed by an earlier test');
  fs.copyFileSync(path.join(ROOT, 'examples', 'require.cjs'), path.join(project, 'require.cjs'));
  assert.deepEqual(await node('require.cjs', { QUEUE: queueName() }), ['round trip: from CommonJS']);
});

test('the installed package: tsc --noEmit --strict accepts a user file (ESM and CommonJS) and docs/clients.md\'s block', { timeout: 90000 }, async () => {
  assert.ok(project, 'installed by an earlier test');
  for (const f of ['user.mts', 'user.cts', 'tsconfig.json']) {
    fs.copyFileSync(path.join(__dirname, 'fixtures', f), path.join(project, f));
  }
  // docs/clients.md's Node block, checked as a user's ES module too.
  const docs = fs.readFileSync(path.join(REPO, 'docs', 'clients.md'), 'utf8');
  const blocks = [...docs.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]);
  assert.ok(blocks.length >= 1, 'docs/clients.md has a js block');
  fs.writeFileSync(path.join(project, 'docs.mts'), blocks.join('\n'));
  const tsconfig = JSON.parse(fs.readFileSync(path.join(project, 'tsconfig.json'), 'utf8').replace(/^\s*\/\/.*$/gm, ''));
  tsconfig.files.push('docs.mts');
  fs.writeFileSync(path.join(project, 'tsconfig.json'), JSON.stringify(tsconfig));
  // The user's own @types/node: this package's devDependency.
  const tsc = require.resolve('typescript/bin/tsc');
  try {
    await run(process.execPath, [tsc, '-p', 'tsconfig.json', '--typeRoots', path.join(ROOT, 'node_modules', '@types')], {
      cwd: project,
      timeout: 80000,
    });
  } catch (e) {
    assert.fail(`tsc reported errors:\n${e.stdout}${e.stderr}`);
  }
});
