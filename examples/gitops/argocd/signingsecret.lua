-- Argo CD health of a herald.dev SigningSecret: Healthy once its keys are ready
-- (Ready=True), Degraded when the operator refuses it (Ready=False), else Progressing.
local hs = { status = "Progressing", message = "Waiting for the Herald operator" }
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
if obj.status.observedGeneration == nil or obj.status.observedGeneration < obj.metadata.generation then
  hs.message = "The Herald operator has not processed the latest spec yet"
  return hs
end
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Ready" then
    if c.status == "True" then
      hs.status = "Healthy"
    elseif c.status == "False" then
      hs.status = "Degraded"
    end
    hs.message = (c.reason or "") .. ": " .. (c.message or "")
  end
end
return hs
