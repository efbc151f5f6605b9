-- Argo CD health of a duplex DisaggregatedServing (argocd-cm key
-- resource.customizations.health.duplex.dev_DisaggregatedServing), read from the status the operator writes:
-- status.observedGeneration and the conditions Ready, ConfigValid, Progressing, PrefillReady, DecodeReady and
-- RouterReady. Only Lua's base, table and string libraries are used (Argo CD's sandbox).
local hs = { status = "Progressing", message = "Waiting for the duplex operator to report status" }
local st = obj.status
if st == nil or st.observedGeneration == nil then
  return hs
end
local generation = obj.metadata.generation
if generation ~= nil and st.observedGeneration < generation then
  hs.message = "Waiting for the duplex operator to observe generation " .. tostring(generation)
  return hs
end

local conditions = {}
if st.conditions ~= nil then
  for _, c in ipairs(st.conditions) do
    conditions[c.type] = c
  end
end

-- A spec the operator refuses: it leaves the children as they were, nothing will converge until the spec changes.
local valid = conditions["ConfigValid"]
if valid ~= nil and valid.status == "False" then
  hs.status = "Degraded"
  hs.message = valid.message or "the operator refuses the spec"
  return hs
end

local ready = conditions["Ready"]
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message or "prefill, decode and router are ready"
  return hs
end

-- Not ready. A roll in progress, or a role starting within its Deployment's progress deadline (rollout
-- .progressDeadlineSeconds), is Progressing; a role scaled to zero on purpose is Suspended; a role whose pods are on
-- the current spec and still not ready past that deadline (unschedulable, crashing, failing probes) is Degraded.
local progressing = conditions["Progressing"]
local rolling = progressing ~= nil and progressing.status == "True"
local failing, pending, suspended = {}, {}, {}
for _, role in ipairs({ "PrefillReady", "DecodeReady", "RouterReady" }) do
  local c = conditions[role]
  if c ~= nil and c.status ~= "True" then
    local message = c.message or role
    if c.reason == "ScaledToZero" then
      table.insert(suspended, message)
    elseif rolling or c.reason == "NotCreated" or c.reason == "RollingOut" or c.reason == "Starting" then
      table.insert(pending, message)
    else
      table.insert(failing, message)
    end
  end
end
if #failing > 0 then
  hs.status = "Degraded"
  hs.message = table.concat(failing, "; ")
elseif #pending > 0 then
  hs.status = "Progressing"
  hs.message = table.concat(pending, "; ")
elseif #suspended > 0 then
  hs.status = "Suspended"
  hs.message = table.concat(suspended, "; ")
elseif ready ~= nil then
  hs.message = ready.message or hs.message
end
return hs
