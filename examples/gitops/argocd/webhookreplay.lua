-- Argo CD health of a herald.dev WebhookReplay: Degraded when the request is refused
-- (Ready=False) or failed, Healthy when completed, Progressing while pending or running
-- (a replay that sends runs until every event it enqueued is delivered or dead).
local hs = { status = "Progressing", message = "Waiting for the Herald operator" }
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
if obj.status.observedGeneration == nil or obj.status.observedGeneration < obj.metadata.generation then
  hs.message = "The Herald operator has not processed the latest spec yet"
  return hs
end
local ready, complete
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Ready" then ready = c end
  if c.type == "Complete" then complete = c end
end
local function describe(c)
  return (c.reason or "") .. ": " .. (c.message or "")
end
if ready ~= nil and ready.status == "False" then
  hs.status = "Degraded"
  hs.message = describe(ready)
elseif obj.status.phase == "Completed" then
  hs.status = "Healthy"
  hs.message = "Replay completed"
elseif obj.status.phase == "Failed" then
  hs.status = "Degraded"
  hs.message = complete ~= nil and describe(complete) or "Replay failed"
else
  hs.message = "Replay " .. (obj.status.phase or "Pending")
end
return hs
