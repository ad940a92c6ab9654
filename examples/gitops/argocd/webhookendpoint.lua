-- Argo CD health of a herald.dev WebhookEndpoint, from the status the Herald operator
-- writes: Progressing until the operator has seen the current spec, Degraded while the
-- endpoint is invalid or waits for its SigningSecret (Ready=False), disabled, or failing
-- (Healthy=False), Suspended while spec.paused, else Healthy.
local hs = { status = "Progressing", message = "Waiting for the Herald operator" }

local function condition(kind)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function describe(c)
  return (c.reason or "") .. ": " .. (c.message or "")
end

if obj.status == nil then
  return hs
end
if obj.status.observedGeneration == nil or obj.status.observedGeneration < obj.metadata.generation then
  hs.message = "The Herald operator has not processed the latest spec yet"
  return hs
end
local ready = condition("Ready")
if ready == nil or ready.status == "Unknown" then
  return hs
end
if ready.status == "False" then
  hs.status = "Degraded"
  hs.message = describe(ready)
  return hs
end
local disabled = condition("Disabled")
if disabled ~= nil and disabled.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(disabled)
  return hs
end
if obj.spec.paused == true then
  hs.status = "Suspended"
  hs.message = "Paused: events queue until spec.paused is false"
  return hs
end
local healthy = condition("Healthy")
if healthy ~= nil and healthy.status == "False" then
  hs.status = "Degraded"
  hs.message = describe(healthy)
  return hs
end
hs.status = "Healthy"
if healthy ~= nil then
  hs.message = describe(healthy)
else
  hs.message = "Accepted; no delivery reported yet"
end
return hs
