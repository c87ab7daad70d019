# A strict stand-in for the OCI CLI (`oci`), for xtask's oci-upload tests.
#
# It accepts exactly the options the real commands have, with click's exit code 2 and its
# "No such option" / "Missing option" messages otherwise, and answers in the CLI's JSON shapes.
# The option lists are read from oracle/oci-cli 3.89.3 (src/oci_cli/version.py), commit
# 02d1a3d40b083a539035d993ed1856982914e325:
#   root options, accepted anywhere (the root group has allow_interspersed_args):
#     src/oci_cli/cli_root.py, the decorators of `cli`
#   os ns get, os object delete: services/object_storage/src/oci_cli_object_storage/generated/
#     objectstorage_cli.py (get_namespace, delete_object), with the aliases that
#     objectstorage_cli_extended.py adds (`ns`; -ns/--namespace, -bn, --name for delete)
#   os object put: objectstorage_cli_extended.py (object_put)
#   compute image get, image-shape-compatibility-entry add: services/core/src/oci_cli_compute/
#     generated/compute_cli.py (get_image, add_image_shape_compatibility_entry)
#   compute image import from-object: compute_cli_extended.py (import_image_from_object):
#     create_image's options less image_source_details, instance_id, wait_for_state,
#     max_wait_seconds and wait_interval_seconds, plus its own
#   compute global-image-capability-schema list, image-capability-schema create:
#     compute_cli_extended.py, which regroups compute_cli.py's
#     list_compute_global_image_capability_schemas and renames create's
#     --compute-global-image-capability-schema-version-name
# Every command also has --from-json (json_skeleton_utils.get_cli_json_input_option) and
# -?/-h/--help (cli_util.help_option); confirm_delete_option adds delete's --force.
#
# Every call's arguments are appended, one a line and `--end--` after them, to $FAKE_OCI_LOG.
# State lives in $FAKE_OCI_STATE: the import leaves the image IMPORTING; `image get` answers
# IMPORTING, then PROVISIONING, then $FAKE_OCI_IMPORT_END (default AVAILABLE) from the
# $FAKE_OCI_GETS_BEFORE_END-th call on (default 3; "never" keeps it IMPORTING).
# $FAKE_OCI_NOT_AUTHENTICATED makes every command fail as a bad API key does.

import json
import os
import sys

VERSION = "3.89.3"
IMAGE_ID = "ocid1.image.oc1.eu-frankfurt-1.aaaatest"

# (aliases, the canonical one last; takes a value; required)
ROOT = [
    (["-v", "--version"], False, False),
    (["--release-info"], False, False),
    (["--latest-version"], False, False),
    (["--config-file"], True, False),
    (["--profile"], True, False),
    (["--cli-rc-file", "--defaults-file"], True, False),
    (["--opc-request-id", "--opc-client-request-id", "--request-id"], True, False),
    (["--region"], True, False),
    (["--endpoint"], True, False),
    (["--realm-specific-endpoint"], False, False),
    (["--connection-timeout"], True, False),
    (["--enable-dual-stack"], False, False),
    (["--federation-endpoint"], True, False),
    (["--read-timeout"], True, False),
    (["--cert-bundle"], True, False),
    (["--output"], True, False),
    (["--query"], True, False),
    (["--raw-output"], False, False),
    (["--auth"], True, False),
    (["--auth-purpose"], True, False),
    (["--generate-full-command-json-input"], False, False),
    (["--generate-param-json-input"], True, False),
    (["--proxy"], True, False),
    (["--no-retry"], False, False),
    (["--max-retries"], True, False),
    (["-d", "--debug"], False, False),
    (["-i", "--cli-auto-prompt"], False, False),
    (["-?", "-h", "--help"], False, False),
    (["--enable-propagation"], True, False),
]

COMMON = [(["--from-json"], True, False), (["-?", "-h", "--help"], False, False)]

COMMANDS = {
    ("os", "ns", "get"): [(["--compartment-id"], True, False)],
    ("os", "object", "put"): [
        (["-ns", "--namespace", "--namespace-name"], True, True),
        (["-bn", "--bucket-name"], True, True),
        (["--file"], True, True),
        (["--name"], True, False),
        (["--if-match"], True, False),
        (["--content-md5"], True, False),
        (["--opc-checksum-algorithm"], True, False),
        (["--opc-content-crc32c"], True, False),
        (["--opc-content-sha256"], True, False),
        (["--opc-content-sha384"], True, False),
        (["--metadata"], True, False),
        (["--content-type"], True, False),
        (["--content-language"], True, False),
        (["--content-encoding"], True, False),
        (["--force"], False, False),
        (["--no-overwrite"], False, False),
        (["--no-multipart"], False, False),
        (["--part-size"], True, False),
        (["--disable-parallel-uploads"], False, False),
        (["--parallel-upload-count"], True, False),
        (["--verify-checksum"], False, False),
        (["--content-disposition"], True, False),
        (["--cache-control"], True, False),
        (["--encryption-key-file"], True, False),
        (["--storage-tier"], True, False),
        (["--opc-sse-kms-key-id"], True, False),
    ],
    ("os", "object", "delete"): [
        (["-ns", "--namespace", "--namespace-name"], True, True),
        (["-bn", "--bucket-name"], True, True),
        (["--name", "--object-name"], True, True),
        (["--if-match"], True, False),
        (["--version-id"], True, False),
        (["--force"], False, False),
    ],
    ("compute", "image", "import", "from-object"): [
        (["--compartment-id"], True, True),
        (["--defined-tags"], True, False),
        (["--display-name"], True, False),
        (["--freeform-tags"], True, False),
        (["--launch-mode"], True, False),
        (["-ns", "--namespace"], True, True),
        (["-bn", "--bucket-name"], True, True),
        (["--name"], True, True),
        (["--source-image-type"], True, False),
        (["--operating-system"], True, False),
        (["--operating-system-version"], True, False),
    ],
    ("compute", "image", "get"): [(["--image-id"], True, True)],
    ("compute", "global-image-capability-schema", "list"): [
        (["--compartment-id"], True, False),
        (["--display-name"], True, False),
        (["--limit"], True, False),
        (["--page"], True, False),
        (["--sort-by"], True, False),
        (["--sort-order"], True, False),
        (["--all"], False, False),
        (["--page-size"], True, False),
    ],
    ("compute", "image-capability-schema", "create"): [
        (["--compartment-id"], True, True),
        (["--image-id"], True, True),
        (["--schema-data"], True, True),
        (["--freeform-tags"], True, False),
        (["--display-name"], True, False),
        (["--defined-tags"], True, False),
        (["--wait-for-state"], True, False),
        (["--max-wait-seconds"], True, False),
        (["--wait-interval-seconds"], True, False),
        (["--global-image-capability-schema-version-name"], True, True),
    ],
    ("compute", "image-shape-compatibility-entry", "add"): [
        (["--image-id"], True, True),
        (["--shape-name"], True, True),
        (["--memory-constraints"], True, False),
        (["--ocpu-constraints"], True, False),
        (["--force"], False, False),
    ],
}


def usage_error(message):
    sys.stderr.write("Usage: oci [OPTIONS] COMMAND [ARGS]...\n\nError: %s\n" % message)
    sys.exit(2)


def lookup(table, name):
    for spec in table:
        if name in spec[0]:
            return spec
    return None


def parse(argv):
    """The command path and {canonical option: value}, or a click-like usage error."""
    words, found, i = [], {}, 0
    command = None
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg.startswith("-") and arg != "-":
            name, eq, inline = arg.partition("=")
            spec = lookup(COMMANDS.get(command, []) + COMMON if command else [], name)
            spec = spec or lookup(ROOT, name)
            if spec is None:
                usage_error("No such option: %s" % name)
            aliases, valued, _ = spec
            if valued:
                if eq:
                    value = inline
                elif i < len(argv):
                    value = argv[i]
                    i += 1
                else:
                    usage_error("Option '%s' requires an argument." % name)
            else:
                value = True
            found[aliases[-1]] = value
        elif command is None:
            words.append(arg)
            if tuple(words) in COMMANDS:
                command = tuple(words)
        else:
            usage_error("Got unexpected extra argument (%s)" % arg)
    if command is None:
        if words:
            usage_error("No such command '%s'." % " ".join(words))
        return None, found
    for aliases, _, required in COMMANDS[command]:
        if required and aliases[-1] not in found:
            usage_error("Missing option '%s'." % aliases[-1])
    return command, found


def load_state(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def main():
    argv = sys.argv[1:]
    with open(os.environ["FAKE_OCI_LOG"], "a") as log:
        log.write("".join(a + "\n" for a in argv) + "--end--\n")
    command, opts = parse(argv)
    if command is None:
        if "--version" in opts:
            print(VERSION)
            return
        usage_error("Missing command.")
    if os.environ.get("FAKE_OCI_NOT_AUTHENTICATED"):
        sys.stderr.write('ServiceError: {"code": "NotAuthenticated", "status": 401}\n')
        sys.exit(1)
    state_path = os.environ["FAKE_OCI_STATE"]
    state = load_state(state_path)
    out = None
    if command == ("os", "ns", "get"):
        out = {"data": "axtestns"}
    elif command == ("os", "object", "put"):
        out = {"etag": "5b6d", "opc-multipart-md5": "x-2"}
    elif command == ("os", "object", "delete"):
        if "--force" not in opts:
            # Without --force the real CLI asks on stdin, and with none it aborts.
            sys.stderr.write("Are you sure you want to delete this resource? [y/N]: Aborted!\n")
            sys.exit(1)
    elif command == ("compute", "image", "import", "from-object"):
        state["image"] = "IMPORTING"
        state["gets"] = 0
        out = {"data": {"id": IMAGE_ID, "lifecycle-state": "IMPORTING"}}
    elif command == ("compute", "image", "get"):
        if opts["--image-id"] != IMAGE_ID or "image" not in state:
            sys.stderr.write('ServiceError: {"code": "NotAuthorizedOrNotFound", "status": 404}\n')
            sys.exit(1)
        state["gets"] += 1
        end = os.environ.get("FAKE_OCI_GETS_BEFORE_END", "3")
        if end != "never" and state["gets"] >= int(end):
            state["image"] = os.environ.get("FAKE_OCI_IMPORT_END", "AVAILABLE")
        elif state["gets"] > 1:
            state["image"] = "PROVISIONING"
        out = {"data": {"id": IMAGE_ID, "lifecycle-state": state["image"]}}
    elif command == ("compute", "global-image-capability-schema", "list"):
        out = {"data": [{"id": "ocid1.computeglobalimgcapschema.oc1..g",
                         "current-version-name": "c8b2-v3"}]}
    else:
        # Both changes need an image that exists and is AVAILABLE.
        if state.get("image") != "AVAILABLE" or opts["--image-id"] != IMAGE_ID:
            sys.stderr.write('ServiceError: {"code": "IncorrectState", "status": 409, '
                             '"message": "image is %s"}\n' % state.get("image"))
            sys.exit(1)
        if command == ("compute", "image-capability-schema", "create"):
            out = {"data": {"id": "ocid1.computeimgcapschema.oc1..s"}}
        else:
            out = {"data": {"image-id": IMAGE_ID, "shape": opts["--shape-name"]}}
    with open(state_path, "w") as f:
        json.dump(state, f)
    if out is not None:
        print(json.dumps(out, indent=2))


main()
