#!/bin/sh
# One-shot set-up of MinIO for zbak (the compose service minio-init, image minio/mc):
# the bucket zbak-archive and a user that may use that bucket only
# (minio-zbak-policy.json). Idempotent: every `docker compose up` runs it again.
set -eu
: "${MINIO_ROOT_USER:?}" "${MINIO_ROOT_PASSWORD:?}" "${ZBAK_S3_ACCESS_KEY:?}" "${ZBAK_S3_SECRET_KEY:?}"

mc alias set local http://minio:9000 "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD" >/dev/null
mc mb --ignore-existing local/zbak-archive
mc admin user add local "$ZBAK_S3_ACCESS_KEY" "$ZBAK_S3_SECRET_KEY"
mc admin policy create local zbak-archive /etc/zbak/minio-zbak-policy.json
# "attach" fails when the policy is attached already (a second `up`): that is fine.
mc admin policy attach local zbak-archive --user "$ZBAK_S3_ACCESS_KEY" \
    || mc admin user info local "$ZBAK_S3_ACCESS_KEY" | grep -q zbak-archive
echo "minio-init: bucket zbak-archive ready for user $ZBAK_S3_ACCESS_KEY"
