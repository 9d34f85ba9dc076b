import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { build } from 'esbuild';
import { Miniflare } from 'miniflare';

/**
 * Workers on the real workerd runtime, through Miniflare (which runs the workerd binary of the
 * `workerd` package). Miniflare declares Node ≥ 22; on Node 20 the workerd tests are skipped, loudly.
 * workerd itself is the same binary under every Node, so the tests run on each Node CI runs that
 * Miniflare supports (22 and 24): each test file starts one workerd process, and its time is the
 * suites' own lease waits, not load.
 */
export const WORKERD_NODE_MIN_MAJOR = 22;
export const workerdSupported = Number(process.versions.node.split('.')[0]) >= WORKERD_NODE_MIN_MAJOR;
if (!workerdSupported) {
  console.warn(
    `\n!!!!!!!! SKIPPING workerd TESTS: Miniflare needs Node ≥ ${WORKERD_NODE_MIN_MAJOR}, this is ${process.version} !!!!!!!!\n`,
  );
}

const root = join(import.meta.dirname, '../..');
const { exports } = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as {
  exports: Record<string, { import: string }>;
};

/** The settings of a `wrangler.jsonc` the tests read: comments are whole lines. */
export interface WranglerConfig {
  main: string;
  compatibility_date: string;
  compatibility_flags?: string[];
  durable_objects?: { bindings: { name: string; class_name: string }[] };
}

export function readWranglerConfig(file: string): WranglerConfig {
  return JSON.parse(readFileSync(file, 'utf8').replace(/^\s*\/\/.*$/gm, '')) as WranglerConfig;
}

/**
 * Bundles `entry` as wrangler does (esbuild, `workerd`/`worker` conditions, `node:*` left to the
 * runtime), with `retrysafe/*` taken from the built dist/ as a user's install would give it, and
 * starts it in workerd with `config`'s compatibility settings and SQLite-backed Durable Objects.
 */
export async function startWorker(entry: string, config: WranglerConfig): Promise<Miniflare> {
  const bundle = await build({
    entryPoints: [entry],
    bundle: true,
    write: false,
    format: 'esm',
    platform: 'browser',
    conditions: ['workerd', 'worker'],
    external: ['node:*', 'cloudflare:*'],
    logLevel: 'silent',
    plugins: [
      {
        name: 'retrysafe',
        setup(plugin) {
          plugin.onResolve({ filter: /^retrysafe(\/|$)/ }, ({ path }) => {
            const target = exports[path === 'retrysafe' ? '.' : `.${path.slice('retrysafe'.length)}`];
            if (!target) return { errors: [{ text: `retrysafe exports no ${path}` }] };
            return { path: join(root, target.import) };
          });
        },
      },
    ],
  });
  const bindings = config.durable_objects?.bindings ?? [];
  const worker = new Miniflare({
    modules: [{ type: 'ESModule', path: join(root, 'worker.js'), contents: bundle.outputFiles[0]!.text }],
    compatibilityDate: config.compatibility_date,
    compatibilityFlags: config.compatibility_flags ?? [],
    durableObjects: Object.fromEntries(
      bindings.map(({ name, class_name }) => [name, { className: class_name, useSQLite: true }]),
    ),
  });
  await worker.ready;
  return worker;
}
