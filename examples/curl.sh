#!/usr/bin/env bash
# One turn from the shell: create a session, post a message, print the reply as it
# streams (the Mutation stream's deltas), then the committed reply. Needs curl and jq.
#
#   BASE_URL=http://127.0.0.1:8000 API_KEY=evm_... examples/curl.sh "hello there"
set -euo pipefail

BASE_URL="${BASE_URL:-http://127.0.0.1:8000}"
TEXT="${1:-hello from curl}"
auth=()
if [ -n "${API_KEY:-}" ]; then auth=(-H "Authorization: Bearer $API_KEY"); fi

api() { curl -sS --fail-with-body "${auth[@]}" -H 'content-type: application/json' "$@"; }

session=$(api -X POST "$BASE_URL/v1/sessions" -d '{"title":"curl example"}' | jq -r .id)
echo "session: $session"

# `after=0` replays the (new) session from its start: nothing of the reply is missed,
# however late the stream connects.
exec 3< <(curl -sSN "${auth[@]}" "$BASE_URL/v1/sessions/$session/messages/stream?after=0")
stream=$!

api -X POST "$BASE_URL/v1/sessions/$session/messages" \
  -d "$(jq -nc --arg text "$TEXT" '{message: {content: [{type: "text", text: $text}]}}')" >/dev/null

event=""
status=1
while IFS= read -r -t 30 line <&3; do
  case "$line" in
    "event: "*) event="${line#event: }" ;;
    "data: "*)
      data="${line#data: }"
      if [ "$event" = delta ]; then
        printf '%s' "$(jq -j .text <<<"$data")"
      elif [ "$event" = message ] && [ "$(jq -r '.message | "\(.role) \(.state)"' <<<"$data")" = "agent done" ]; then
        echo
        echo "agent: $(jq -r '[.message.content[] | select(.type == "text") | .text] | join("")' <<<"$data")"
        status=0
        break
      fi
      ;;
  esac
done
kill "$stream" 2>/dev/null || true
if [ "$status" -ne 0 ]; then echo "no reply within 30 s" >&2; fi
exit "$status"
