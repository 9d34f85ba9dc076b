import type { Writable } from 'node:stream';

/**
 * Calls `counted` on every write `socket` makes (one `_write` or `_writev`, however many commands
 * it carries): how a test sees that a client's commands went out batched.
 */
export function onEachWrite(socket: Writable, counted: () => void): void {
  const patched = socket as Writable & {
    _write: (...args: unknown[]) => void;
    _writev: (...args: unknown[]) => void;
  };
  const { _write: write, _writev: writev } = patched;
  patched._write = (...args) => {
    counted();
    write.apply(patched, args);
  };
  patched._writev = (...args) => {
    counted();
    writev.apply(patched, args);
  };
}
