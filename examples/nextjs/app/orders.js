// Every order of this `next start` process, by route handler or server action. On globalThis: Next
// bundles route handlers and pages apart, each with its own copy of this module.
globalThis.orderBook ??= [];

/** Saves an order and answers it with its id. */
export function addOrder(order) {
  const saved = { id: globalThis.orderBook.length + 1, ...order };
  globalThis.orderBook.push(saved);
  return saved;
}

/** Every order, oldest first. */
export const allOrders = () => globalThis.orderBook;
