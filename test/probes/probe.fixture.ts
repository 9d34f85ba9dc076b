import { describeStoreConformance } from '../../src/testing/index.js';
import { mutationProbes, probeBases } from '../../src/testing/probes.js';

// One project of test/probes/vitest.config.ts per subject: a probe's name, or `unbroken <base>`.
const name = process.env.RETRYSAFE_PROBE ?? '';
const base = /^unbroken (\w+)$/.exec(name)?.[1] as keyof typeof probeBases | undefined;
const open = base ? probeBases[base] : mutationProbes.find((probe) => probe.name === name)?.open;
if (!open) throw new Error(`no mutation probe named ${JSON.stringify(name)}`);
describeStoreConformance(name, open);
