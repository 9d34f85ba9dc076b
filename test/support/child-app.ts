import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';

/** An app started as a child process that printed `{"port": …}` as its first line on stdout. */
export interface ChildApp {
  child: ChildProcess;
  /** Resolves with the signal that ended the child (`null` if it exited by itself). */
  exited: Promise<NodeJS.Signals | null>;
  port: number;
}

/**
 * Runs `node script ...args` and waits for its first stdout line, `{"port": …}`. The child is
 * pushed onto `children` as soon as it is spawned, for the caller's `afterAll` to kill.
 */
export async function startApp(script: string, args: string[], children: ChildProcess[]): Promise<ChildApp> {
  const child = spawn(process.execPath, [script, ...args], { stdio: ['ignore', 'pipe', 'inherit'] });
  children.push(child);
  const exited = once(child, 'exit').then(([, signal]) => signal as NodeJS.Signals | null);
  let out = '';
  for await (const chunk of child.stdout!) {
    out += chunk;
    if (out.includes('\n')) break;
  }
  const { port } = JSON.parse(out) as { port: number };
  return { child, exited, port };
}
