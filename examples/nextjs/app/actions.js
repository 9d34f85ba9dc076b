'use server';
import { memoryStore } from 'retrysafe/memory';
import { idempotentAction } from 'retrysafe/next';
import { addOrder } from './orders.js';

// One order per rendered form: its hidden key makes a double submit, a resubmission after a lost
// answer and a retried action answer the first submission's order.
const store = memoryStore();

export const placeOrder = idempotentAction({ store, required: true }, async (_previous, form) => {
  const item = form.get('item');
  if (typeof item !== 'string' || item.trim() === '') return { error: 'Name an item.' };
  return { order: addOrder({ item: item.trim() }) };
});
