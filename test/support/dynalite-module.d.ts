// dynalite ships no types: the part of its API the tests use.
declare module 'dynalite' {
  interface DynaliteOptions {
    path?: string;
    createTableMs?: number;
    deleteTableMs?: number;
    updateTableMs?: number;
    maxItemSizeKb?: number;
  }
  export default function dynalite(options?: DynaliteOptions): import('node:http').Server;
}
