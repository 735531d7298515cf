// Timers shared by many jobs: one timer for a set of items that all fall
// due the same length of time after they were added (the lease extensions
// of a stream's jobs, the timeouts of a queue's handlers), instead of a
// timer per job. Adding and removing an item costs a Map operation.

/**
 * @internal Items that fall due `periodMs` after add(). Because every item
 * has the same period, the Map's insertion order is the order they fall due
 * in: one timer, armed for the oldest item, is all it takes. A removed item
 * is forgotten at once (nothing lingers until its time).
 */
export class DueSet<T> {
  readonly periodMs: number;
  #items = new Map<T, number>();
  #onDue: (item: T) => void;
  #timer: NodeJS.Timeout | null = null;

  constructor(periodMs: number, onDue: (item: T) => void) {
    this.periodMs = periodMs;
    this.#onDue = onDue;
  }

  get size(): number {
    return this.#items.size;
  }

  /** The first item (oldest first) for which `pred` holds: a scan, for rare look-ups. */
  find(pred: (item: T) => boolean): T | undefined {
    for (const item of this.#items.keys()) if (pred(item)) return item;
    return undefined;
  }

  has(item: T): boolean {
    return this.#items.has(item);
  }

  /** Due periodMs from now (again from now if it was already in). */
  add(item: T): void {
    this.#items.delete(item);
    this.#items.set(item, Date.now() + this.periodMs);
    // Not disarmed when the set empties: a timer that finds nothing due
    // simply is not armed again, so a set that empties and fills again
    // between jobs does not make a timer per job.
    if (!this.#timer) this.#arm(this.periodMs);
  }

  delete(item: T): boolean {
    return this.#items.delete(item);
  }

  /** Forgets every item and the timer. */
  clear(): void {
    this.#items.clear();
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
  }

  #arm(ms: number): void {
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = setTimeout(() => this.#fire(), Math.max(1, ms));
  }

  #fire(): void {
    this.#timer = null;
    const now = Date.now();
    for (const [item, due] of this.#items) {
      if (due > now) {
        this.#arm(due - now);
        return;
      }
      this.#items.delete(item);
      // onDue may add the item again (due a period from now, so at the
      // end): the loop then meets it last and arms the timer for it.
      this.#onDue(item);
    }
  }
}
