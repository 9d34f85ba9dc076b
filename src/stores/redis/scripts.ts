import type { Cluster, Redis } from 'ioredis';

// Record format. A record is one string, so a claim is one native `SET … NX PX … GET`: it writes
// a new key, or answers the record there without writing. Lines, then the raw bytes:
//   in progress: P \n token \n leaseEndsBeforeExpiryMs \n createdBeforeExpiryMs \n fingerprint [\n steps]
//     where steps, once a step is saved, is JSON {"steps": [{name, value}…], "request": …}
//   completed:   C \n createdBeforeExpiryMs \n status \n fingerprint's byte length \n headers JSON \n fingerprint body
// Times count back from the key's own expiry, which Redis sets from its clock: the claim needs no
// clock of ours, and lease and creation times stay Redis's ("now" from the database server).
//
// Each script names its KEYS and ARGV in locals at its top, in the order `RetrysafeCommands`
// passes them; the fragments below use those names.

// A Lua pattern: an in-progress record's lease offset, creation offset, fingerprint and steps
// (`''`, or a newline and their JSON). It also reads the first 80 bytes of one (GETRANGE), whose
// fingerprint it then cuts short.
const IN_PROGRESS_FIELDS = `'^P\\n[^\\n]*\\n([^\\n]*)\\n([^\\n]*)\\n([^\\n]*)(.*)$'`;

// The claim of a key that holds a record in progress (its lease needs the key's TTL): what the
// native claim cannot decide. Replies like the native claim ({'record', value}).
export const CLAIM_HELD_LUA = `local key = KEYS[1]
local fingerprint = ARGV[1]
local newRecord = ARGV[2]
local retainMs = ARGV[3]
local value = redis.call('GET', key)
if value and string.sub(value, 1, 1) == 'P' then
  local leaseOffset, created, heldFingerprint, steps = string.match(value, ${IN_PROGRESS_FIELDS})
  if heldFingerprint ~= fingerprint then return {'mismatch'} end
  local expiresIn = redis.call('PTTL', key)
  local left = expiresIn - tonumber(leaseOffset)
  if left > 0 then return {'in_progress', left} end
  -- A takeover: the finished steps stay with the record and go back to the new owner, and so do
  -- its creation time and retention (they count from the first claim, so an operation that
  -- keeps failing still ends), the key's TTL growing only should the new lease outlive it.
  -- The expiry is set again as the same instant (PXAT), not as the TTL just read: the clock may
  -- pass a millisecond between the read and the SET, which moved createdAt by one.
  local owner, newLeaseOffset = string.match(newRecord, '^(P\\n[^\\n]*\\n)([^\\n]*)\\n')
  local lease = tonumber(retainMs) - tonumber(newLeaseOffset)
  local expiresAt = redis.call('PEXPIRETIME', key)
  local grown = 0
  if expiresIn < lease then
    grown = lease - expiresIn
    expiresIn = lease
  end
  redis.call('SET', key, owner .. string.format('%d\\n%d\\n', expiresIn - lease, tonumber(created) + grown) .. fingerprint .. steps, 'PXAT', expiresAt + grown)
  return {'acquired', steps}
elseif value then
  return {'record', value}
end
redis.call('SET', key, newRecord, 'PX', retainMs)
return {'acquired'}`;

// Is `key` the record in progress that `owner` ("P \n token \n") owns? Sets \`value\`.
const OWNED = `local value = redis.pcall('GET', key)
if type(value) ~= 'string' or string.sub(value, 1, #owner) ~= owner then return 0 end`;

// KEEPTTL: retention counts from the claim.
export const COMPLETE_LUA = `local key = KEYS[1]
local owner = ARGV[1]
local status = ARGV[2]
local headersJson = ARGV[3]
local body = ARGV[4]
local channel = ARGV[5]
${OWNED}
local _, created, fingerprint = string.match(value, ${IN_PROGRESS_FIELDS})
redis.call('SET', key, 'C\\n' .. created .. '\\n' .. status .. '\\n' .. #fingerprint .. '\\n' .. headersJson .. '\\n' .. fingerprint .. body, 'KEEPTTL')
redis.call('PUBLISH', channel, key)
return 1`;

export const RELEASE_LUA = `local key = KEYS[1]
local owner = ARGV[1]
local channel = ARGV[2]
${OWNED}
redis.call('DEL', key)
redis.call('PUBLISH', channel, key)
return 1`;

// The key's TTL grows with the lease should the lease outlive it, and the offsets with it.
export const RENEW_LUA = `local key = KEYS[1]
local owner = ARGV[1]
local lease = tonumber(ARGV[2])
${OWNED}
local _, created, fingerprint, steps = string.match(value, ${IN_PROGRESS_FIELDS})
local expiresIn = redis.call('PTTL', key)
local grown = 0
if expiresIn < lease then
  redis.call('PEXPIRE', key, lease)
  grown = lease - expiresIn
  expiresIn = lease
end
redis.call('SET', key, owner .. string.format('%d\\n%d\\n', expiresIn - lease, tonumber(created) + grown) .. fingerprint .. steps, 'KEEPTTL')
return 1`;

// One SET: the step joins the record's steps. `request` is '' for none.
export const SAVE_STEP_LUA = `local key = KEYS[1]
local owner = ARGV[1]
local stepName = ARGV[2]
local stepValue = ARGV[3]
local request = ARGV[4]
${OWNED}
local head, steps = string.match(value, '^(P\\n[^\\n]*\\n[^\\n]*\\n[^\\n]*\\n[^\\n]*)(.*)$')
local data = {steps = {}}
if steps ~= '' then data = cjson.decode(string.sub(steps, 2)) end
table.insert(data.steps, {name = stepName, value = stepValue})
if request ~= '' then data.request = request end
redis.call('SET', key, head .. '\\n' .. cjson.encode(data), 'KEEPTTL')
return 1`;

// KEYS: records. Replies, per key, {fingerprint, steps JSON, ms since its lease passed} for those
// in progress with a passed lease and a saved request; false for the others.
export const ABANDONED_LUA = `local out = {}
for i, key in ipairs(KEYS) do
  out[i] = false
  if redis.call('TYPE', key).ok == 'string' then
    local value = redis.call('GET', key)
    local leaseOffset, _, fingerprint, steps = string.match(value, ${IN_PROGRESS_FIELDS})
    if leaseOffset and steps ~= '' then
      local left = redis.call('PTTL', key) - tonumber(leaseOffset)
      if left <= 0 then out[i] = {fingerprint, string.sub(steps, 2), -left} end
    end
  end
end
return out`;

// Ms left on a live lease, or -1 when the record is not in progress.
export const LEASE_LEFT_LUA = `local key = KEYS[1]
local head = redis.call('GETRANGE', key, 0, 79)
local leaseOffset = string.match(head, ${IN_PROGRESS_FIELDS})
if not leaseOffset then return -1 end
local left = redis.call('PTTL', key) - tonumber(leaseOffset)
if left <= 0 then return -1 end
return left`;

// KEYS: records. Replies {state, status, lease_until_ms, created_at_ms, expires_at_ms} per key;
// state is nil for a key that is gone (or is not one of our records). Times count from the key's
// absolute expiry (PEXPIRETIME), never from TIME plus a TTL read at another instant, so each read of
// a record gives the same times.
export const SUMMARIES_LUA = `local out = {}
for i, key in ipairs(KEYS) do
  local expiresAt = redis.call('PEXPIRETIME', key)
  out[i] = {false}
  if redis.call('TYPE', key).ok == 'string' then
    local head = redis.call('GETRANGE', key, 0, 79)
    local leaseOffset, created = string.match(head, ${IN_PROGRESS_FIELDS})
    if leaseOffset then
      local _, _, _, steps = string.match(redis.call('GET', key), ${IN_PROGRESS_FIELDS})
      out[i] = {'in_progress', false, expiresAt - tonumber(leaseOffset), expiresAt - tonumber(created), expiresAt, steps}
    else
      local created, status = string.match(head, '^C\\n([^\\n]*)\\n([^\\n]*)\\n')
      if created then out[i] = {'completed', status, false, expiresAt - tonumber(created), expiresAt} end
    end
  end
end
return out`;

export const DELETE_LUA = `local key = KEYS[1]
local channel = ARGV[1]
if redis.call('DEL', key) == 0 then return 0 end
redis.call('PUBLISH', channel, key)
return 1`;

export type SummaryReply = [
  string | null,
  string | null,
  string | null,
  string | null,
  number,
  string | undefined,
][];

/** The scripts as client commands; each takes its arguments in the order its script names them. */
export interface RetrysafeCommands {
  retrysafeClaimHeldBuffer(
    key: string,
    fingerprint: string,
    newRecord: string,
    retainMs: number,
  ): Promise<(Buffer | number | null)[]>;
  retrysafeComplete(
    key: string,
    owner: string,
    status: number,
    headersJson: string,
    body: Buffer,
    channel: string,
  ): Promise<number>;
  retrysafeRelease(key: string, owner: string, channel: string): Promise<number>;
  retrysafeRenew(key: string, owner: string, leaseMs: number): Promise<number>;
  retrysafeLeaseLeft(key: string): Promise<number>;
  retrysafeSummaries(numberOfKeys: number, ...keys: string[]): Promise<SummaryReply>;
  retrysafeDelete(key: string, channel: string): Promise<number>;
  retrysafeSaveStep(
    key: string,
    owner: string,
    stepName: string,
    stepValue: string,
    request: string,
  ): Promise<number>;
  retrysafeAbandoned(numberOfKeys: number, ...keys: string[]): Promise<([string, string, number] | null)[]>;
}

/** Defines the scripts on `client` (ioredis loads each on first use) and returns it as their commands. */
export function defineScripts(client: Redis | Cluster): RetrysafeCommands {
  client.defineCommand('retrysafeClaimHeld', { numberOfKeys: 1, lua: CLAIM_HELD_LUA });
  client.defineCommand('retrysafeComplete', { numberOfKeys: 1, lua: COMPLETE_LUA });
  client.defineCommand('retrysafeRelease', { numberOfKeys: 1, lua: RELEASE_LUA });
  client.defineCommand('retrysafeRenew', { numberOfKeys: 1, lua: RENEW_LUA });
  client.defineCommand('retrysafeLeaseLeft', { numberOfKeys: 1, lua: LEASE_LEFT_LUA, readOnly: true });
  client.defineCommand('retrysafeSummaries', { lua: SUMMARIES_LUA, readOnly: true });
  client.defineCommand('retrysafeDelete', { numberOfKeys: 1, lua: DELETE_LUA });
  client.defineCommand('retrysafeSaveStep', { numberOfKeys: 1, lua: SAVE_STEP_LUA });
  client.defineCommand('retrysafeAbandoned', { lua: ABANDONED_LUA, readOnly: true });
  return client as unknown as RetrysafeCommands;
}
