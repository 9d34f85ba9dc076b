'use client';
import { useActionState } from 'react';
import { placeOrder } from './actions.js';

// The key comes from the server's render; a lost answer leaves the form (and its key) in place,
// so pressing again asks for the same order.
async function submit(previous, form) {
  try {
    return await placeOrder(previous, form);
  } catch {
    return { error: 'No answer from the server: press Place order again (it will not order twice).' };
  }
}

export function OrderForm({ idempotencyKey, keyField }) {
  const [state, action, pending] = useActionState(submit, null);
  return (
    <form action={action}>
      <input type="hidden" name={keyField} value={idempotencyKey} />
      <label>
        Item <input name="item" defaultValue="book" required />
      </label>
      <button type="submit">Place order</button>
      <p role="status">
        {pending
          ? 'Placing…'
          : state?.order
            ? `Order #${state.order.id}: ${state.order.item}`
            : (state?.error ?? '')}
      </p>
    </form>
  );
}
